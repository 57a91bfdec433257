"""Reads the per-process statistics segments the runtime publishes (csrc/runtime/neuron_stats.h).

Pure Python, no torch: neuron-ls and neuron-top list other processes even where this one cannot load the
extension. The layout here must match ``nrn_stats_segment`` (version 1).
"""

import errno
import os
import struct
import time

MAGIC = 0x5354415453524E4E
VERSION = 1
MAX_CORES = 128
_HEADER = struct.Struct("<QIIQiiQQQQQQii512s")
_CORE = struct.Struct("<iiiiQQQQQQQQ")
SIZE = _HEADER.size + MAX_CORES * _CORE.size
_CORE_FIELDS = ("logical_index", "physical_index", "chip", "physical_cores", "capacity", "reserved",
                "allocated", "peak_allocated", "native_ops", "fallback_ops", "busy_ns")


def stats_dir() -> str:
    return os.environ.get("NEURON_RT_STATS_DIR") or "/dev/shm/neuron-stats"


def _start_ticks(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return 0
    fields = data[data.rindex(b")") + 2:].split()
    return int(fields[19])  # field 22 of the whole line; fields[0] is field 3


def _alive(pid: int, start_ticks: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as e:
        if e.errno == errno.ESRCH:
            return False
    now = _start_ticks(pid)
    return not (start_ticks and now and now != start_ticks)  # a reused pid is another process


def parse(data: bytes):
    """One segment as a dict, or None if it is not (yet) a complete version-1 segment."""
    if len(data) < SIZE:
        return None
    (magic, version, size, seq, pid, count, start_ticks, update_ns, cpu_ns, interval_ms, native, fallback,
     nc_config, _pad, cmdline) = _HEADER.unpack_from(data, 0)
    if magic != MAGIC or version != VERSION or seq % 2:
        return None
    cores = []
    for i in range(min(count, MAX_CORES)):
        vals = _CORE.unpack_from(data, _HEADER.size + i * _CORE.size)
        cores.append(dict(zip(_CORE_FIELDS, vals[:len(_CORE_FIELDS)])))
    return {"pid": pid, "start_ticks": start_ticks, "seq": seq, "update_unix_ns": update_ns, "cpu_ns": cpu_ns,
            "interval_ms": interval_ms, "native_ops": native, "fallback_ops": fallback, "nc_config": nc_config,
            "cmdline": cmdline.split(b"\0", 1)[0].decode("utf-8", "replace"), "cores": cores}


def read_all(directory: str = None, cleanup: bool = True, exclude_self: bool = True):
    """Every live process's segment, by pid. Segments of dead (or reused) pids are removed on the way."""
    directory = directory or stats_dir()
    out = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return out
    for name in names:
        if not name.startswith("neuron-stats-"):
            continue
        try:
            pid = int(name[len("neuron-stats-"):])
        except ValueError:
            continue
        if exclude_self and pid == os.getpid():
            continue
        path = os.path.join(directory, name)
        seg = None
        for _ in range(20):  # the writer holds seq odd for microseconds
            try:
                with open(path, "rb") as f:
                    data = f.read(SIZE)
            except OSError:
                break
            seg = parse(data)
            if seg is not None:
                break
            time.sleep(0.001)
        start = seg["start_ticks"] if seg else 0
        if not _alive(pid, start):
            if cleanup:
                try:
                    os.unlink(path)
                except OSError:
                    pass
            continue
        if seg is not None:
            out[pid] = seg
    return out

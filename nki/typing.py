"""``nki.typing``: annotation helpers (``nt.tensor``, ``nt.mutable_tensor``); they carry no behaviour here."""

from ._core import NkiTensor


class _Annotation:
    def __init__(self, name):
        self.name = name

    def __getitem__(self, item):
        return self

    def __repr__(self):
        return f"nt.{self.name}"


tensor = _Annotation("tensor")
mutable_tensor = _Annotation("mutable_tensor")
scalar = _Annotation("scalar")
Tensor = NkiTensor

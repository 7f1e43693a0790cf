"""Read and write PyTorch .pth checkpoints (state dicts of tensors) without torch.

Reading: both formats torch.save has used
  - zip (torch >= 1.6): <prefix>/data.pkl + <prefix>/data/<key> raw storages;
  - legacy (torch < 1.6): magic number, protocol, sys info, the object pickle, the storage key
    list, then each storage as int64 element count + raw bytes.
The pickle is read with a restricted unpickler: only collections.OrderedDict,
torch._utils._rebuild_tensor(_v2), torch._utils._rebuild_parameter and torch.*Storage types
are resolved; anything else is refused (no arbitrary code runs). Tensors come back as numpy
arrays (copied, C-contiguous, native byte order).

Writing: the zip layout of torch.save (data.pkl at pickle protocol 2 with persistent ids
('storage', torch.<T>Storage, key, 'cpu', numel) and torch._utils._rebuild_tensor_v2 calls,
data/<key> records aligned to 64 bytes, byteorder, version), so real torch.load reads it.
`legacy=True` writes the pre-1.6 format instead (for tests of the legacy reader).
"""
from __future__ import annotations

import io
import pickle
import struct
import zipfile
from collections import OrderedDict

import numpy as np

# torch storage type name -> numpy dtype
STORAGE_DTYPES = {
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "HalfStorage": np.float16,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}
DTYPE_STORAGES = {np.dtype(v).str: k for k, v in STORAGE_DTYPES.items()}

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001


class _StorageType:
    def __init__(self, name: str):
        self.name = name
        self.dtype = np.dtype(STORAGE_DTYPES[name])


class _Storage:
    """A storage: key, dtype and (once read) its flat numpy data."""

    def __init__(self, key: str, dtype: np.dtype, numel: int):
        self.key, self.dtype, self.numel = key, dtype, numel
        self.data: np.ndarray | None = None


class _LazyTensor:
    def __init__(self, storage: _Storage, offset: int, size, stride):
        self.storage, self.offset = storage, int(offset)
        self.size, self.stride = tuple(size), tuple(stride)

    def materialise(self) -> np.ndarray:
        data = self.storage.data
        if data is None:
            raise pickle.UnpicklingError(f"storage {self.storage.key} has no data")
        if len(self.size) == 0:
            return np.array(data[self.offset], dtype=data.dtype)
        needed = self.offset + 1 + sum((n - 1) * s for n, s in zip(self.size, self.stride) if n > 0)
        if any(n == 0 for n in self.size):
            return np.zeros(self.size, dtype=data.dtype)
        if needed > data.size:
            raise pickle.UnpicklingError(f"tensor exceeds storage {self.storage.key}")
        view = np.lib.stride_tricks.as_strided(
            data[self.offset:], shape=self.size,
            strides=tuple(s * data.itemsize for s in self.stride))
        return np.ascontiguousarray(view).astype(data.dtype.newbyteorder("="), copy=False)


def _rebuild_tensor(storage, storage_offset, size, stride, *_rest):
    return _LazyTensor(storage, storage_offset, size, stride)


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None, *_rest):
    return data


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, f, load_storage):
        super().__init__(f)
        self._load_storage = load_storage

    def find_class(self, module, name):
        if module == "collections" and name == "OrderedDict":
            return OrderedDict
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor"):
            return _rebuild_tensor
        if module == "torch._utils" and name == "_rebuild_parameter":
            return _rebuild_parameter
        if module == "torch" and name in STORAGE_DTYPES:
            return _StorageType(name)
        raise pickle.UnpicklingError(f"refusing to load global {module}.{name} from a checkpoint")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and pid and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unsupported persistent id {pid!r}")
        return self._load_storage(pid)


def _finish(obj):
    """Replace lazy tensors with numpy arrays in (nested) dicts / lists / tuples."""
    if isinstance(obj, _LazyTensor):
        return obj.materialise()
    if isinstance(obj, dict):
        for k in list(obj.keys()):
            obj[k] = _finish(obj[k])
        return obj
    if isinstance(obj, list):
        return [_finish(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_finish(v) for v in obj)
    return obj


def _storage_dtype(stype) -> np.dtype:
    if isinstance(stype, _StorageType):
        return stype.dtype
    raise pickle.UnpicklingError(f"unsupported storage type {stype!r}")


def _load_zip(path_or_file) -> object:
    with zipfile.ZipFile(path_or_file) as zf:
        names = zf.namelist()
        pkl = [n for n in names if n == "data.pkl" or n.endswith("/data.pkl")]
        if len(pkl) != 1:
            raise ValueError("not a torch zip checkpoint (no unique data.pkl)")
        prefix = pkl[0][: -len("data.pkl")]
        byteorder = "little"
        if prefix + "byteorder" in names:
            byteorder = zf.read(prefix + "byteorder").decode().strip()
        storages: dict[str, _Storage] = {}

        def load_storage(pid):
            _, stype, key, _location, numel = pid[:5]
            key = str(key)
            if key not in storages:
                dt = _storage_dtype(stype).newbyteorder("<" if byteorder == "little" else ">")
                raw = zf.read(f"{prefix}data/{key}")
                st = _Storage(key, dt, int(numel))
                st.data = np.frombuffer(raw, dtype=dt)
                storages[key] = st
            return storages[key]

        obj = _RestrictedUnpickler(io.BytesIO(zf.read(pkl[0])), load_storage).load()
        return _finish(obj)


def _load_legacy(f) -> object:
    storages: dict[str, _Storage] = {}

    def load_storage(pid):
        # ('storage', storage_type, root_key, location, size, view_metadata)
        _, stype, key, _location, numel = pid[:5]
        view = pid[5] if len(pid) > 5 else None
        key = str(key)
        if key not in storages:
            storages[key] = _Storage(key, _storage_dtype(stype), int(numel))
        if view is not None:
            raise pickle.UnpicklingError("legacy storage views are not supported")
        return storages[key]

    def no_storage(pid):
        raise pickle.UnpicklingError("unexpected persistent id in legacy header")

    magic = _RestrictedUnpickler(f, no_storage).load()
    if magic != LEGACY_MAGIC:
        raise ValueError("not a torch checkpoint (bad magic number)")
    protocol = _RestrictedUnpickler(f, no_storage).load()
    if protocol != LEGACY_PROTOCOL:
        raise ValueError(f"unsupported legacy protocol {protocol}")
    sys_info = _RestrictedUnpickler(f, no_storage).load()
    little = sys_info.get("little_endian", True) if isinstance(sys_info, dict) else True
    obj = _RestrictedUnpickler(f, load_storage).load()
    keys = _RestrictedUnpickler(f, no_storage).load()
    for key in keys:
        st = storages[str(key)]
        dt = st.dtype.newbyteorder("<" if little else ">")
        (numel,) = struct.unpack("<q" if little else ">q", f.read(8))
        raw = f.read(numel * dt.itemsize)
        if len(raw) != numel * dt.itemsize:
            raise ValueError("truncated legacy checkpoint")
        st.data = np.frombuffer(raw, dtype=dt)
    return _finish(obj)


def load(path) -> object:
    """torch.load(path, map_location='cpu', weights_only=True), tensors as numpy arrays."""
    with open(path, "rb") as f:
        head = f.read(4)
        f.seek(0)
        if head[:2] == b"PK":
            return _load_zip(f)
        return _load_legacy(f)


# ---------------------------------------------------------------------------------------------
# writing


class _PickleWriter:
    """Emits a protocol-2 pickle of an OrderedDict of tensors by hand (so that the globals
    torch._utils._rebuild_tensor_v2 / torch.FloatStorage can be named without torch)."""

    def __init__(self):
        self.b = bytearray(b"\x80\x02")  # PROTO 2

    def glob(self, module, name):
        self.b += b"c" + module.encode() + b"\n" + name.encode() + b"\n"

    def str_(self, s: str):
        d = s.encode("utf-8")
        self.b += b"X" + struct.pack("<I", len(d)) + d

    def int_(self, v: int):
        if 0 <= v < 256:
            self.b += b"K" + bytes([v])
        elif 0 <= v < 65536:
            self.b += b"M" + struct.pack("<H", v)
        elif -(2 ** 31) <= v < 2 ** 31:
            self.b += b"J" + struct.pack("<i", v)
        else:
            d = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
            self.b += b"\x8a" + bytes([len(d)]) + d  # LONG1

    def tuple_(self, items):
        self.b += b"("
        for v in items:
            self.int_(v)
        self.b += b"t"

    def ordered_dict_empty(self):
        self.glob("collections", "OrderedDict")
        self.b += b")R"  # EMPTY_TUPLE, REDUCE

    def tensor(self, key: str, storage_type: str, numel: int, shape, stride, legacy: bool):
        self.glob("torch._utils", "_rebuild_tensor_v2")
        self.b += b"("  # MARK for the argument tuple
        # persistent id
        self.b += b"("
        self.str_("storage")
        self.glob("torch", storage_type)
        self.str_(key)
        self.str_("cpu")
        self.int_(numel)
        if legacy:
            self.b += b"N"  # view_metadata None
        self.b += b"tQ"  # TUPLE, BINPERSID
        self.int_(0)  # storage offset
        self.tuple_(shape)
        self.tuple_(stride)
        self.b += b"\x89"  # requires_grad False
        self.ordered_dict_empty()  # backward_hooks
        self.b += b"tR"  # TUPLE, REDUCE

    def end(self):
        self.b += b"."
        return bytes(self.b)


def _state_dict_pickle(state: dict, legacy: bool):
    w = _PickleWriter()
    blobs: list = []
    _write_dict(w, state, blobs, legacy)
    return w.end(), blobs


def _write_dict(w: _PickleWriter, state: dict, blobs: list, legacy: bool) -> None:
    """A dict of tensors as an OrderedDict (a state dict); a dict holding dicts (a wrapper such
    as {"params_ema": state_dict}) as a plain dict, its dicts written the same way."""
    if any(isinstance(v, dict) for v in state.values()):
        w.b += b"}"  # EMPTY_DICT
    else:
        w.ordered_dict_empty()
    w.b += b"("  # MARK for SETITEMS
    for name, arr in state.items():
        if isinstance(arr, dict):
            w.str_(name)
            _write_dict(w, arr, blobs, legacy)
            continue
        arr = np.asarray(arr, order="C")
        dt = arr.dtype.newbyteorder("<")
        st = DTYPE_STORAGES.get(np.dtype(arr.dtype.newbyteorder("=")).str)
        if st is None:
            raise TypeError(f"{name}: unsupported dtype {arr.dtype}")
        shape = arr.shape
        stride, acc = [], 1
        for n in reversed(shape):
            stride.append(acc)
            acc *= max(n, 1)
        stride = tuple(reversed(stride))
        key = str(len(blobs))
        w.str_(name)
        w.tensor(key, st, int(arr.size), shape, stride, legacy)
        blobs.append((key, arr.astype(dt, copy=False).tobytes(), arr.dtype.itemsize))
    w.b += b"u"  # SETITEMS


def save(state: dict, path, legacy: bool = False) -> None:
    """torch.save(state_dict, path) for a flat dict of name -> numpy array, or for a dict of
    such dicts (a wrapped checkpoint such as GFPGAN's {"params_ema": state_dict})."""
    data_pkl, blobs = _state_dict_pickle(state, legacy)
    if legacy:
        with open(path, "wb") as f:
            for obj in (LEGACY_MAGIC, LEGACY_PROTOCOL,
                        {"protocol_version": LEGACY_PROTOCOL, "little_endian": True,
                         "type_sizes": {"short": 2, "int": 4, "long": 4}}):
                pickle.dump(obj, f, protocol=2)
            f.write(data_pkl)
            pickle.dump([k for k, _, _ in blobs], f, protocol=2)
            for _key, raw, itemsize in blobs:
                f.write(struct.pack("<q", len(raw) // itemsize))
                f.write(raw)
        return
    prefix = "archive/"
    with open(path, "wb") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as zf:
        def record(name, payload: bytes):
            info = zipfile.ZipInfo(prefix + name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED
            # pad with an extra field so the data starts on a 64-byte boundary (as torch does)
            header = 30 + len(info.filename.encode())
            start = f.tell() + header + 4
            pad = (-start) % 64
            info.extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
            zf.writestr(info, payload)

        record("data.pkl", data_pkl)
        record("byteorder", b"little")
        for key, raw, _ in blobs:
            record(f"data/{key}", raw)
        record("version", b"3\n")


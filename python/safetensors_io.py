"""A minimal safetensors writer and reader (float32 only), no third-party package needed.

Layout: 8-byte little-endian header length N, N bytes of UTF-8 JSON header (padded with spaces to a multiple of 8),
then the raw little-endian tensor data. The header maps each tensor name to {"dtype": "F32", "shape": [...],
"data_offsets": [begin, end]} (offsets relative to the start of the data), plus "__metadata__": {str: str}.
Tensors are written in name order.
"""
import json
import struct

import numpy as np


def save(path, tensors, metadata=None):
    """tensors: {name: array-like (numpy or torch)}; metadata: {str: str}."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs, offset = [], 0
    for name in sorted(tensors):
        t = tensors[name]
        if hasattr(t, "detach"):
            t = t.detach().cpu().numpy()
        a = np.ascontiguousarray(np.asarray(t, dtype="<f4"))
        raw = a.tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load(path):
    """Returns (tensors {name: np.ndarray float32}, metadata {str: str})."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, info in header.items():
        if info["dtype"] != "F32":
            raise ValueError(f"{name}: dtype {info['dtype']} (only F32 supported)")
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(data[base + b:base + e], dtype="<f4").reshape(info["shape"]).copy()
    return out, meta

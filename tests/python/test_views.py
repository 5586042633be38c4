#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Zero-copy numpy and torch views of grants; skipped (77) without numpy and torch."""

from __future__ import annotations

import unittest
import warnings

import tierd
from tierd import MiB

import tier

try:
    import numpy as np
except ImportError:  # python3-numpy
    np = None  # type: ignore[assignment]
try:
    import torch
except ImportError:  # python3-torch
    torch = None  # type: ignore[assignment]

need_numpy = unittest.skipIf(np is None, "numpy is not installed (python3-numpy)")
need_torch = unittest.skipIf(torch is None, "torch is not installed (python3-torch)")


class TestViews(tierd.DaemonTestCase):
    @need_numpy
    def test_numpy_is_zero_copy(self) -> None:
        c = self.client()
        t = c.create("t", 1 * MiB)
        with t.pin(tier.HOST) as g:
            a = g.numpy()
            self.assertEqual((a.dtype, a.shape), (np.uint8, (MiB,)))
            self.assertTrue(a.flags.writeable)
            self.assertEqual(a.ctypes.data, g.ptr)  # the mapping itself
            f = g.numpy("float32", (256, 1024))
            self.assertEqual((f.dtype, f.shape), (np.float32, (256, 1024)))
            f[:] = np.arange(256 * 1024, dtype=np.float32).reshape(256, 1024)
            self.assertEqual(g.memoryview()[4:8].tobytes(), np.float32(1).tobytes())
            mv = g.memoryview()
            mv[0:4] = np.float32(-2.5).tobytes()
            self.assertEqual(f[0, 0], -2.5)
            with self.assertRaises(ValueError):
                g.numpy("float64", (3,))  # 1M / 8 elements do not make 3
            with self.assertRaises(TypeError):
                g.numpy("not-a-dtype")
            self.assertEqual(g.numpy(np.int16).shape, (MiB // 2,))
        # the array outlived the unpin without blocking the release of the memoryviews
        with self.assertRaises(ValueError):
            mv[0]
        with self.assertRaises(tier.TierError):
            g.numpy()
        t.evict(tier.NVME)
        with t.pin(tier.HOST, tier.READ) as g:
            f = g.numpy(np.float32, (256, 1024))
            self.assertEqual(f[0, 0], -2.5)
            self.assertEqual(f[255, 1023], 256 * 1024 - 1)
        t.destroy()

    @need_torch
    def test_torch_is_zero_copy_through_nvme(self) -> None:
        c = self.client()
        t = c.create("t", 2 * MiB)
        with t.pin(tier.HOST) as g:
            x = g.torch(torch.float16, (1024, 1024))
            self.assertEqual((x.dtype, tuple(x.shape), x.device.type), (torch.float16, (1024, 1024), "cpu"))
            self.assertEqual(x.data_ptr(), g.ptr)
            x.fill_(1.5)
            x[1023, 1023] = -3.0
            mv = g.memoryview()  # the writes are in the mapping
            self.assertEqual(mv[0:2].tobytes(), torch.tensor([1.5], dtype=torch.float16).numpy().tobytes())
            self.assertEqual(mv[-2:].tobytes(), torch.tensor([-3.0], dtype=torch.float16).numpy().tobytes())
            self.assertEqual(g.torch().dtype, torch.uint8)
            self.assertEqual(g.torch("int32").shape, (2 * MiB // 4,))
            with self.assertRaises(ValueError):
                g.torch("no_such_dtype")
            with self.assertRaises(TypeError):
                g.torch(3)  # type: ignore[arg-type]
        t.evict(tier.NVME)
        st = t.stat()
        self.assertEqual((st.state["host"], st.state["nvme"]), ("absent", "resident"))
        t.prefetch(tier.HOST)
        with t.pin(tier.HOST, tier.READ) as g:
            y = g.torch(torch.float16).view(1024, 1024)
            self.assertEqual(float(y[0, 0]), 1.5)
            self.assertEqual(float(y[1023, 1023]), -3.0)
            self.assertEqual(int((y == 1.5).sum()), 1024 * 1024 - 1)
        # emulated VRAM grants are host memory: CPU tensors too
        t.prefetch(tier.VRAM)
        with t.pin(tier.VRAM, tier.READ) as g:
            self.assertEqual(float(g.torch(torch.float16)[0]), 1.5)
        t.destroy()

    @need_numpy
    @need_torch
    def test_large_tensor_one_view(self) -> None:
        c = self.client()
        seg = c.segment_size(tier.HOST)
        size = 2 * seg  # two whole segments, as one range
        t = c.create("large", size)
        with t.pin(tier.HOST, tier.WRITE) as g:
            a = g.numpy(np.uint32)
            self.assertEqual(a.size, size // 4)
            a[:] = np.arange(size // 4, dtype=np.uint32)
        t.evict(tier.NVME)
        with t.pin(tier.HOST, tier.READ) as g:
            x = g.torch(torch.int32)
            self.assertEqual(x.numel(), size // 4)
            self.assertEqual(int(x[-1]), size // 4 - 1)
            self.assertEqual(int(x[seg // 4]), seg // 4)  # first word of the second segment
            self.assertTrue(np.array_equal(g.numpy(np.uint32), np.arange(size // 4, dtype=np.uint32)))
        t.destroy()

    @need_numpy
    @need_torch
    def test_read_pin_views_are_read_only(self) -> None:
        """The views of a READ pin were writable, and what was written vanished at the clean unpin;
        now memoryview and numpy views of a pin without WRITE are read-only, and torch (which has no
        read-only tensors) gets a tensor over a read-only buffer without torch's warning."""
        c = self.client()
        t = c.create("t", 4096)
        with t.pin(tier.HOST, tier.WRITE) as g:
            g.memoryview()[:4] = b"abcd"
        t.evict(tier.NVME)
        with t.pin(tier.HOST, tier.READ) as g:
            mv = g.memoryview()
            self.assertTrue(mv.readonly)
            with self.assertRaises(TypeError):
                mv[0] = 1
            a = g.numpy()
            self.assertFalse(a.flags.writeable)
            with self.assertRaises(ValueError):
                a[0] = 1
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                x = g.torch(torch.uint8)
            self.assertEqual(bytes(x[:4].tolist()), b"abcd")
            self.assertEqual(bytes(mv[:4]), b"abcd")
        for mode in (tier.WRITE, tier.READ_WRITE):
            with t.pin(tier.HOST, mode) as g:
                self.assertFalse(g.memoryview().readonly)
                self.assertTrue(g.numpy().flags.writeable)
        t.destroy()

    @need_torch
    def test_read_pin_torch_write_kept(self) -> None:
        """A write through the torch() tensor of a READ pin (torch has no read-only tensors) changed the
        pinned copy, the unpin was clean, and the write vanished once tierd dropped that copy: the next pin
        read the bytes of before.  The unpin now sees it (torch's version counter, shared by the tensor's
        views, even once the tensor itself is gone) and is dirty, with a ReadPinWrittenWarning; a READ pin
        whose tensor was only read stays clean."""
        c = self.client()
        t = c.create("t", 4096)
        with t.pin(tier.HOST, tier.WRITE) as g:
            g.torch(torch.float32).fill_(1.0)
        t.evict(tier.NVME)
        with warnings.catch_warnings():
            warnings.simplefilter("error")          # read only: no warning, a clean unpin
            with t.pin(tier.HOST, tier.READ) as g:
                self.assertEqual(g.torch(torch.float32, (4, 256)).sum().item(), 1024.0)
        self.assertFalse(t.stat().dirty[tier.HOST])
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with t.pin(tier.HOST, tier.READ) as g:
                row = g.torch(torch.float32, (4, 256))[1]       # the tensor g.torch() gave goes at once
                row.fill_(2.0)
        said = [str(x.message) for x in w if issubclass(x.category, tier.ReadPinWrittenWarning)]
        self.assertEqual(len(said), 1, [str(x.message) for x in w])
        self.assertIn("unpin 't' in host: the pin is READ but its torch() tensor was written", said[0])
        self.assertTrue(t.stat().dirty[tier.HOST])
        t.evict(tier.NVME)                          # the host copy goes: what NVMe has is what comes back
        with t.pin(tier.HOST, tier.READ) as g:
            x = g.torch(torch.float32, (4, 256))
            self.assertEqual([x[i].sum().item() for i in range(4)], [256.0, 512.0, 256.0, 256.0])
        t.destroy()

    @need_torch
    def test_read_pin_torch_under_inference_mode(self) -> None:
        """torch() of a READ pin under torch.inference_mode() gives an inference tensor, which has no
        version counter (reading ``_version`` raises): the watch for writes through a READ pin's tensor
        made torch() itself raise there, where an evaluation loop only reads.  Such a tensor is not
        watched (its writes are not seen, as the docstring says); the pin works as before it."""
        c = self.client()
        t = c.create("t", 4096)
        with t.pin(tier.HOST, tier.WRITE) as g:
            g.torch(torch.float32).fill_(1.0)
        t.evict(tier.NVME)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with torch.inference_mode():
                with t.pin(tier.HOST, tier.READ) as g:
                    x = g.torch(torch.float32, (4, 256))
                    self.assertTrue(x.is_inference())
                    self.assertEqual(x.sum().item(), 1024.0)
        self.assertFalse(t.stat().dirty[tier.HOST])
        t.destroy()

    @need_torch
    def test_cuda_array_interface(self) -> None:
        # no cuda backend here: check the interface of a made-up device grant, not a CUDA tensor
        c = self.client()
        t = c.create("t", 4096)
        g = t.pin(tier.HOST)
        g.ptr, g.device_ptr = None, 0x7F0000000000
        self.assertEqual(
            g.__cuda_array_interface__,
            {"shape": (4096,), "typestr": "|u1", "data": (0x7F0000000000, False), "strides": None, "version": 3},
        )
        with self.assertRaises(TypeError):
            g.memoryview()
        with self.assertRaises(TypeError):
            g.numpy() if np is not None else g.memoryview()
        g.unpin()
        with self.assertRaises(tier.TierError):
            g.__cuda_array_interface__
        t.destroy()


if __name__ == "__main__":
    tierd.main()

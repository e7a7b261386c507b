"""Memory-traffic probes with the NVFP4 kernel's access pattern, next to the kernel itself.

    PYTHONPATH=$PWD python3 tools/probe_nvfp4_traffic.py

One thread per 16-element bf16 block (two 16-byte loads), PDL-launched like the op, no quantization
arithmetic: mode 0 writes 8 code bytes + 1 scale byte per block with the scale bytes in row order
(linear), mode 1 only reads, mode 2 writes the codes only, mode 3 writes the scale bytes where the
row-major thread mapping puts them in the 128x4 layout (4-byte pieces 512 bytes apart per warp).
Prints time and fraction of the copy bandwidth per mode and for ``gdnjit.nvfp4_quantize`` (128x4) on
the same inputs. This is how docs/perf.md "NVFP4 v3" found the scattered scale stores.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root, last

import bench_common as bc  # noqa: E402

SOURCE = r"""
struct Args { const void* x; void* q; void* sf; unsigned n_items; unsigned pad; };
__device__ __forceinline__ uint4 ld_nc_v4(const void* p) {
  uint4 v;
  asm("ld.global.nc.v4.u32 { %0, %1, %2, %3 }, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
extern "C" __global__ void __launch_bounds__(128) probe(const Args p) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const unsigned t = blockIdx.x * 128 + threadIdx.x;
  if (t >= p.n_items) return;
  const unsigned char* src = (const unsigned char*)p.x + (size_t)t * 32;
  const uint4 a = ld_nc_v4(src), b = ld_nc_v4(src + 16);
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const unsigned s = a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w;
#if MODE == 1  // reads only (the store never happens, but the compiler cannot know)
  if (s == 0x12345679u) ((unsigned*)p.q)[t] = s;
#else
  *reinterpret_cast<uint2*>((unsigned char*)p.q + (size_t)t * 8) = make_uint2(s, s * 3u);
#endif
#if MODE == 0
  ((unsigned char*)p.sf)[t] = (unsigned char)s;
#elif MODE == 3  // the 128x4 offset of (row t / NB, column t % NB)
  const unsigned r = t / NB, c = t % NB;
  const size_t off = (c % 4) + (c / 4) * 512ull + (r % 32) * 16 + ((r % 128) / 32) * 4 + (r / 128) * (128ull * NB);
  ((unsigned char*)p.sf)[off] = (unsigned char)s;
#endif
}
"""
MODES = {0: "codes + scales (linear)", 1: "reads only", 2: "codes only", 3: "codes + scales (128x4, row-major threads)"}


def main() -> int:
    import gdnjit
    from gdnjit.compile import compile_cubin
    from gdnjit.launch import Launcher, load_function
    from gdnjit.timing import time_graph_us

    dev = torch.device("cuda", torch.cuda.current_device())
    bw = bc.copy_bandwidth(dev)
    l2 = bc.l2_bytes(dev)
    print(f"{torch.cuda.get_device_name(dev)}: copy {bw / 1e12:.2f} TB/s")
    args = [("x", "ptr"), ("q", "ptr"), ("sf", "ptr"), ("n_items", "i32"), ("pad", "i32")]
    for M, K in [(8192, 2048), (4096, 8192), (8192, 8192), (16384, 8192)]:
        launchers = {}
        for mode in MODES:
            r = compile_cubin(f"#define MODE {mode}\n#define NB {K // 16}u\n" + SOURCE, "sm_90", "probe")
            mod, fn = load_function(r.cubin, "probe", dev.index)
            launchers[mode] = Launcher("probe", mod, fn, dev.index, 128, 0, args)
        n = M * K
        n_sets = max(2, min(32, -(-3 * l2 // (n * 2))))
        xs = [torch.randn(M, K, device=dev, dtype=torch.bfloat16) for _ in range(n_sets)]
        qs = [torch.empty(M, K // 2, device=dev, dtype=torch.uint8) for _ in range(n_sets)]
        sfs = [torch.empty(-(-M // 128) * 128, K // 16, device=dev, dtype=torch.uint8) for _ in range(n_sets)]
        items = n // 16
        grid = -(-items // 128)
        floor = n * 2.5625 / bw * 1e6
        row = [f"M={M} K={K} floor {floor:.1f} us"]
        for mode, launcher in launchers.items():
            us = time_graph_us(lambda i: launcher.launch_pdl(
                grid, [xs[i].data_ptr(), qs[i].data_ptr(), sfs[i].data_ptr(), items, 0]), n_sets, replays=15)
            row.append(f"mode {mode} ({MODES[mode]}) {us:.1f} ({floor / us:.2f})")
        gs = torch.tensor([448.0 * 6 / 10.0], device=dev)
        us = time_graph_us(lambda i: gdnjit.nvfp4_quantize(xs[i], gs), n_sets, replays=15)
        row.append(f"nvfp4_quantize {us:.1f} ({floor / us:.2f})")
        print("\n  ".join(row), flush=True)
        del xs, qs, sfs
    return 0


if __name__ == "__main__":
    sys.exit(main())

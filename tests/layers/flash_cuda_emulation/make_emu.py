#!/usr/bin/env python3
"""Rewrites kernels/src/cuda/flash_attention_cuda.cpp (or flash_attention_f32_cuda.cpp)
into plain C++ for the host emulation: the CUDA headers go, the PTX wrappers (from '// --- PTX wrappers' to
the next '// --- ' section) are replaced by prims.inc, kernel launches <<<...>>>
become emu_launch(...). The kernels themselves are used verbatim.

  make_emu.py <flash_attention[_f32]_cuda.cpp> <out.cpp>
"""
import re
import sys

src, out = sys.argv[1], sys.argv[2]
s = open(src).read()
s = re.sub(r'#include <cuda_[a-z0-9_]+\.h>\n', '', s)
if '// --- PTX wrappers' in s:
    a = s.index('// --- PTX wrappers')
    b = s.index('\n// --- ', a + 1) + 1  # the next section
    s = s[:a] + '#include "prims.inc"\n' + s[b:]
s = s.replace('extern __shared__ __align__(16) unsigned char flash_smem[];', '')
s = s.replace('Kokkos::DefaultExecutionSpace().cuda_stream()', 'emu_stream()')
s, n = re.subn(r'([\w:]+(?:<[^<>]*>)?)<<<(.*?)>>>\((.*?)\);', r'emu_launch((\1), \2, \3);', s)
if n == 0:
    sys.exit('make_emu.py: no kernel launch found')
open(out, 'w').write(s)

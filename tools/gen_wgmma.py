"""tools/gen_wgmma.py — writes the wgmma inline-asm wrappers that kernels/cuda/flash_hopper.cu
holds between its "wgmma wrappers" markers (one accumulator operand per register makes them long):
  python3 tools/gen_wgmma.py > /tmp/w.inc   then paste over the old block."""
def ss(n, ty, name, trans_a=0):
    """A and B from shared memory; trans_a = 1: A is MN-major (M contiguous), as K^T from K's rows."""
    nreg = n // 2
    regs = ",".join("%%%d" % i for i in range(nreg))
    a, b, sc = nreg, nreg + 1, nreg + 2
    ops = ", ".join('"+f"(d[%d])' % i for i in range(nreg))
    return f'''__device__ __forceinline__ void {name}(float (&d)[{nreg}], uint64_t da, uint64_t db, int accumulate) {{
  asm volatile(
      "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{sc}, 0;\\n"
      "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {{{regs}}}, %{a}, %{b}, p, 1, 1, {trans_a}, 0;\\n}}\\n"
      : {ops}
      : "l"(da), "l"(db), "r"(accumulate));
}}
'''
def rs(n, ty, name):
    nreg = n // 2
    regs = ",".join("%%%d" % i for i in range(nreg))
    a0 = nreg
    b, sc = nreg + 4, nreg + 5
    ops = ", ".join('"+f"(d[%d])' % i for i in range(nreg))
    return f'''__device__ __forceinline__ void {name}(float (&d)[{nreg}], const uint32_t (&a)[4], uint64_t db, int accumulate) {{
  asm volatile(
      "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{sc}, 0;\\n"
      "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {{{regs}}}, {{%{a0},%{a0+1},%{a0+2},%{a0+3}}}, %{b}, p, 1, 1, 1;\\n}}\\n"
      : {ops}
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));
}}
'''
out = []
for ty, tn in (("bf16", "bf16"), ("f16", "f16")):
    out.append(ss(64, ty, f"wgmma_ss_n64_{tn}"))
    out.append(ss(32, ty, f"wgmma_ss_n32_{tn}"))
    out.append(rs(64, ty, f"wgmma_rs_n64_{tn}"))
    out.append(rs(128, ty, f"wgmma_rs_n128_{tn}"))
    out.append(ss(32, ty, f"wgmma_ss_n32_ta_{tn}", trans_a=1))
    out.append(ss(64, ty, f"wgmma_ss_n64_ta_{tn}", trans_a=1))  # backward form 2's dQ^T, hd 128
    out.append(ss(128, ty, f"wgmma_ss_n128_{tn}"))  # forward form 2's S = Q K^T over 128 keys
print("\n".join(out))

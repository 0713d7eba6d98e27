#!/usr/bin/env python3
"""tools/sim_flash3.py — a host simulation of kernels/cuda/flash_hopper.cu (attention variant
flash3: the forward kernel, the backward's dK / dV and dQ kernels, the fused backward that
adds dQ with atomics into an fp32 workspace, and backward form 2 (fl3_bwd2_kernel: TMA loads,
dQ^T parts in fragment order bulk-added into a workspace, fl3_dq_out2_kernel's lookup, and its
mbarrier ring's phases under random interleavings), and forward form 2 (fl3_fwd2_kernel: TMA
loads of Q, K, V into a ring whose stages a maximally eager producer refills at the kernel's
release points, 128-key tiles, the rescale of O deferred past the overlapped PV, and its four
mbarrier rings under random interleavings) for checking its indexing without a GPU.

It replays the kernel's own address arithmetic (load_tile's swizzled stores, the descriptors'
start addresses and byte offsets, the k-step offsets) against the documented hardware rules, and
its register bookkeeping against the documented fragment layouts, in float64:

  * shared memory is an array of 2-byte elements; cp.async stores 8 of them at the address
    load_tile computes;
  * a wgmma descriptor with 128-byte swizzle reads element (row, k) of a K-major operand at
    start + (row // 8) * SBO + (row % 8) * 128 + 2 k, and element (k, n) of an MN-major one at
    start + (n // 64) * LBO + 2 (n % 64) + (k % 8) * 128 + (k // 8) * SBO (PTX ISA, "canonical
    layouts" for 128B swizzling), both before the swizzle, which XORs address bits 4-6 with bits
    7-9 (Swizzle<3,4,3> on bytes);
  * accumulator element i of thread (warp w, lane l) of a warpgroup is row 16 w + l // 4 +
    8 ((i % 4) // 2), column 8 (i // 4) + 2 (l % 4) + i % 2; a 16-bit A fragment register holds the
    pair (row, 2 (l % 4) + {0, 1}) with rows l // 4 (+8 for registers 1 and 3) and columns + 8
    for registers 2 and 3 (the mma.m16n8k16 A layout per warp);
  * stmatrix .x4 .trans: lane 8 j + c gives the address of the 16-byte row that receives column c
    of matrix j, whose element (r, c) lane 4 r + c // 2 holds in register j (half c % 2);
  * red.global.add.v4.f32 adds 4 floats at a 16-byte-aligned address (checked);
  * cp.async.bulk.tensor with CU_TENSOR_MAP_SWIZZLE_128B writes box row r at dst + 128 r under
    the same XOR (dst 1024-aligned), zeros for rows out of bounds; cp.reduce.async.bulk adds a
    contiguous run of floats.
The fused backward's dS tile is filled with NaN before each tile's stores, so a read of a part no
warpgroup wrote this tile shows up in dQ.

The simulated kernel runs every block of a small problem (T not a multiple of the tiles, GQA) and
its output and log-sum-exp are compared with plain causal attention. This checks the kernel's
indexing as written against those rules; it cannot check that the rules are what the hardware
does (the GPU test in tests/gpu/test_ops_cuda does). Keep it in step with the kernel.

usage: python3 tools/sim_flash3.py        (exit 0 when every case matches)
"""
import math
import sys

import numpy as np

NWG, BM, BN, NT = 2, 128, 64, 256


def swz(addr):
    """128-byte swizzle on byte addresses: bits 4-6 ^= bits 7-9."""
    return addr ^ (((addr >> 7) & 7) << 4)


def load_tile(sm, s_byte, src, row0, T, HD, R):
    """load_tile<HD, R>: rows row0.. of src (T x HD) into column blocks at byte s_byte."""
    cpr = HD // 8
    for k in range(R * cpr // NT):
        for t in range(NT):
            i = t + k * NT
            r, c = i // cpr, i % cpr
            cb, ch = c >> 3, c & 7
            dst = s_byte + cb * R * 128 + r * 128 + ((ch ^ (r & 7)) << 4)
            assert dst % 16 == 0
            vals = src[row0 + r, c * 8:c * 8 + 8] if row0 + r < T else np.zeros(8)
            sm[dst // 2:dst // 2 + 8] = vals


def read_kmajor(sm, start, rows, ks=16, sbo=1024):
    """A (rows x 16) or B (rows = N x 16) through a K-major 128B-swizzled descriptor."""
    m = np.arange(rows)[:, None]
    k = np.arange(ks)[None, :]
    addr = start + (m // 8) * sbo + (m % 8) * 128 + 2 * k
    return sm[swz(addr) // 2]


def read_mnmajor(sm, start, n_total, lbo, ks=16, sbo=1024):
    """B (16 x N) through an MN-major 128B-swizzled descriptor."""
    k = np.arange(ks)[:, None]
    n = np.arange(n_total)[None, :]
    addr = start + (n // 64) * lbo + 2 * (n % 64) + (k % 8) * 128 + (k // 8) * sbo
    return sm[swz(addr) // 2]


def acc_coords(n_acc):
    """(thread-in-warpgroup, register) -> (row, col) of an m64 accumulator with n_acc regs."""
    t = np.arange(128)[:, None]
    i = np.arange(n_acc)[None, :]
    warp, lane = t // 32, t % 32
    row = 16 * warp + lane // 4 + 8 * ((i % 4) // 2)
    col = 8 * (i // 4) + 2 * (lane % 4) + i % 2
    return row, col


def to_frag(mat, n_acc):
    row, col = acc_coords(n_acc)
    return mat[row, col]


def from_frag(frag, n_acc, cols):
    row, col = acc_coords(n_acc)
    out = np.full((64, cols), np.nan)
    out[row, col] = frag
    return out


def pack_a(acc, kc):
    """The kernels' packing: A registers of k-step kc from accumulator n-blocks 2kc and 2kc+1,
    per thread [(c0[0], c0[1]), (c0[2], c0[3]), (c1[0], c1[1]), (c1[2], c1[3])]."""
    c0, c1 = acc[:, 8 * kc:8 * kc + 4], acc[:, 8 * kc + 4:8 * kc + 8]
    return [[(c0[t, 0], c0[t, 1]), (c0[t, 2], c0[t, 3]), (c1[t, 0], c1[t, 1]), (c1[t, 2], c1[t, 3])]
            for t in range(acc.shape[0])]


def a_from_regs(p):
    """P (64 x 16) from per-thread 16-bit A registers p[t][4][2] (the mma.m16n8k16 A layout)."""
    out = np.full((64, 16), np.nan)
    for t in range(128):
        warp, lane = t // 32, t % 32
        g, tg = lane // 4, lane % 4
        r0 = 16 * warp + g
        for reg, (dr, dc) in enumerate(((0, 0), (8, 0), (0, 8), (8, 8))):
            out[r0 + dr, dc + 2 * tg] = p[t][reg][0]
            out[r0 + dr, dc + 2 * tg + 1] = p[t][reg][1]
    return out


def tile_of(L, ntiles, nheads, gh=1):
    """flash_hopper.cu's tile_of: (tile, head) of block L of the one-dimensional grid of ntiles x
    nheads blocks, gh heads' tiles interleaved (the last group may hold fewer heads)."""
    grp, r = divmod(L, gh * ntiles)
    n = min(gh, nheads - grp * gh)
    return r // n, grp * gh + r % n


def blocks(ntiles, nheads, gh=1):
    """The grid's blocks, checking that tile_of maps them one to one onto (tile, head)."""
    seen = {tile_of(L, ntiles, nheads, gh) for L in range(ntiles * nheads)}
    assert seen == {(t, bh) for t in range(ntiles) for bh in range(nheads)}, (ntiles, nheads, gh)
    return range(ntiles * nheads)


def fwd_store(out, lse, o, l0, l1, m0, m1, r0, r1, tg, b, h, HD, T):
    """fwd_store, both forward forms' epilogue: each thread's rows r0 / r1 of O (accumulator
    registers i * 4 + {0, 1} / {2, 3}) divided by the row sums, and lse = m + log2(l)."""
    for th in range(128):
        for r, ll, m, base in ((r0[th], l0[th], m0[th], 0), (r1[th], l1[th], m1[th], 2)):
            if r >= T:
                continue
            for i in range(HD // 8):
                d = i * 8 + tg[th] * 2
                out[b, r, h * HD + d] = o[th, i * 4 + base] / ll
                out[b, r, h * HD + d + 1] = o[th, i * 4 + base + 1] / ll
            if tg[th] == 0:
                lse[b, h, r] = m + math.log2(ll)


def kernel_block(qkv, out, lse, B_, T, H, KV, HD, L, gh=1):
    OD = HD // 2
    QB, KB = BM * 128, BN * 128
    nblk = HD // 64
    smem_bytes = 2 * (BM * HD + 4 * BN * HD)
    sm = np.zeros(smem_bytes // 2)
    Qs, Ks = 0, nblk * QB
    Vs = Ks + 2 * nblk * KB
    nqb = (T + BM - 1) // BM
    t, bh = tile_of(L, nqb, B_ * H, gh)
    qb = nqb - 1 - t
    b, h = divmod(bh, H)
    kv = h // (H // KV)
    q = qkv[b, :, h * HD:(h + 1) * HD]
    kk = qkv[b, :, (H + kv) * HD:(H + kv + 1) * HD]
    vv = qkv[b, :, (H + KV + kv) * HD:(H + KV + kv + 1) * HD]
    q0 = qb * BM
    nkv = (min(q0 + BM, T) + BN - 1) // BN
    sl2 = 1.4426950408889634 / math.sqrt(HD)
    load_tile(sm, Qs, q, q0, T, HD, BM)
    load_tile(sm, Ks, kk, 0, T, HD, BN)
    load_tile(sm, Vs, vv, 0, T, HD, BN)
    state = []
    for wg in range(NWG):
        state.append(dict(o=np.zeros((128, OD)), m0=np.full(128, -np.inf), m1=np.full(128, -np.inf),
                          l0=np.zeros(128), l1=np.zeros(128)))
    t = np.arange(128)
    warp, lane = t // 32, t % 32
    g, tg = lane // 4, lane % 4
    for j in range(nkv):
        if j + 1 < nkv:
            st = (j + 1) & 1
            load_tile(sm, Ks + st * nblk * KB, kk, (j + 1) * BN, T, HD, BN)
            load_tile(sm, Vs + st * nblk * KB, vv, (j + 1) * BN, T, HD, BN)
        key0 = j * BN
        for wg in range(NWG):
            w0 = q0 + wg * 64
            if w0 >= T or key0 > w0 + 63:
                continue
            S = state[wg]
            r0 = w0 + warp * 16 + g
            r1 = r0 + 8
            K = Ks + (j & 1) * nblk * KB
            V = Vs + (j & 1) * nblk * KB
            smat = np.zeros((64, 64))
            for ks in range(HD // 16):
                cb, kin = ks >> 2, (ks & 3) * 32
                a = read_kmajor(sm, Qs + cb * QB + wg * 64 * 128 + kin, 64)
                bm = read_kmajor(sm, K + cb * KB + kin, 64)
                smat += a @ bm.T
            s = to_frag(smat, 32)
            if key0 + BN - 1 > w0:
                for nt in range(8):
                    key = key0 + nt * 8 + tg * 2
                    s[key > r0, nt * 4 + 0] = -np.inf
                    s[key + 1 > r0, nt * 4 + 1] = -np.inf
                    s[key > r1, nt * 4 + 2] = -np.inf
                    s[key + 1 > r1, nt * 4 + 3] = -np.inf
            mx0 = np.max(s[:, [nt * 4 + c for nt in range(8) for c in (0, 1)]], axis=1)
            mx1 = np.max(s[:, [nt * 4 + c for nt in range(8) for c in (2, 3)]], axis=1)
            # shfl_xor 1, 2: the quad of lanes with the same lane // 4 in the warp
            quad = (t // 4)
            mx0 = np.array([mx0[quad == qd].max() for qd in quad])
            mx1 = np.array([mx1[quad == qd].max() for qd in quad])
            n0 = np.maximum(S["m0"], mx0 * sl2)
            n1 = np.maximum(S["m1"], mx1 * sl2)
            a0 = np.exp2(S["m0"] - n0)
            a1 = np.exp2(S["m1"] - n1)
            S["m0"], S["m1"] = n0, n1
            S["l0"] = S["l0"] * a0
            S["l1"] = S["l1"] * a1
            o = S["o"]
            o[:, 0::4] *= a0[:, None]
            o[:, 1::4] *= a0[:, None]
            o[:, 2::4] *= a1[:, None]
            o[:, 3::4] *= a1[:, None]
            for nt in range(8):
                for c, nn in ((0, n0), (1, n0), (2, n1), (3, n1)):
                    s[:, nt * 4 + c] = np.exp2(s[:, nt * 4 + c] * sl2 - nn)
                S["l0"] += s[:, nt * 4 + 0] + s[:, nt * 4 + 1]
                S["l1"] += s[:, nt * 4 + 2] + s[:, nt * 4 + 3]
            omat = from_frag(o, OD, HD)
            for kc in range(4):
                omat += a_from_regs(pack_a(s, kc)) @ read_mnmajor(sm, V + kc * 2048, HD, KB)
            S["o"] = to_frag(omat, OD)
    for wg in range(NWG):
        S = state[wg]
        quad = t // 4
        l0 = np.array([S["l0"][quad == qd].sum() for qd in quad])
        l1 = np.array([S["l1"][quad == qd].sum() for qd in quad])
        r0 = q0 + wg * 64 + warp * 16 + g
        fwd_store(out, lse, S["o"], l0, l1, S["m0"], S["m1"], r0, r0 + 8, tg, b, h, HD, T)


BK = 128


def ws_rows(T):
    return (T + 63) // 64 * 64


def stsm_x4_trans(sm, addrs, regs):
    """stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 for one warp: regs[l][j] = the (lo, hi) pair
    lane l holds of matrix j, (row l // 4, columns 2 (l % 4) + {0, 1}); matrix j's column c is
    stored as the 8 elements (rows 0..7) of the 16-byte row at the address of lane 8 j + c."""
    for j in range(4):
        for c in range(8):
            a = addrs[8 * j + c]
            assert a % 16 == 0
            for r in range(8):
                sm[a // 2 + r] = regs[4 * r + c // 2][j][c % 2]


def red_v4(ws, idx, vals):
    """red.global.add.v4.f32 at float index idx (16-byte aligned)."""
    assert idx % 4 == 0
    ws[idx:idx + 4] += vals


def store_dkdv(dqkv, acc, b, kv, kb0, T, H, KV, HD):
    """The dK / dV epilogue both backward kernels share: each consumer thread adds its fragment
    rows (keys k0 and k0 + 8 of its warp's 16), dK scaled by 1/sqrt(HD), into dqkv."""
    t = np.arange(128)
    warp, lane = t // 32, t % 32
    g, tg = lane // 4, lane % 4
    scale = 1 / math.sqrt(HD)
    koff, voff = (H + kv) * HD, (H + KV + kv) * HD
    for wg in range(NWG):
        k0 = kb0 + wg * 64 + warp * 16 + g
        for th in range(128):
            for half, key in ((0, k0[th]), (1, k0[th] + 8)):
                if key >= T:
                    continue
                for i in range(HD // 8):
                    c = i * 8 + tg[th] * 2
                    r = i * 4 + half * 2
                    dqkv[b, key, koff + c] += acc[wg]["dk"][th, r] * scale
                    dqkv[b, key, koff + c + 1] += acc[wg]["dk"][th, r + 1] * scale
                    dqkv[b, key, voff + c] += acc[wg]["dv"][th, r]
                    dqkv[b, key, voff + c + 1] += acc[wg]["dv"][th, r + 1]


def dkdv_block(qkv, dout, lse, Dr, dqkv, B_, T, H, KV, HD, L, ws=None):
    """fl3_dkdv_kernel<HD, E, DQ> with DQ = ws is not None (then dQ^T goes into ws by atomics)."""
    DQ = ws is not None
    BQ = 64 if HD == 64 else 32
    SN, OD = BQ // 2, HD // 2
    KBy, QBy = BK * 128, BQ * 128
    nblk = HD // 64
    sm = np.zeros((2 * (2 * BK * HD + 2 * 2 * BQ * HD) + (2 * QBy if DQ else 0)) // 2)
    Ks, Vs = 0, nblk * KBy
    Qs = Vs + nblk * KBy
    dOs = Qs + 2 * nblk * QBy
    dSs = dOs + 2 * nblk * QBy
    assert dSs % 1024 == 0
    Ls = np.zeros(2 * BQ)
    Ds = np.zeros(2 * BQ)
    kb, bkv = tile_of(L, (T + BK - 1) // BK, B_ * KV)  # key block 0 (every query) first
    b, kv = divmod(bkv, KV)
    grp = H // KV
    sl2 = 1.4426950408889634 / math.sqrt(HD)
    t = np.arange(128)
    warp, lane = t // 32, t % 32
    g, tg = lane // 4, lane % 4
    kb0 = kb * BK
    i0 = kb0 // BQ
    nq = (T + BQ - 1) // BQ - i0
    total = grp * nq

    def issue(it, stg):
        h = kv * grp + it // nq
        i = i0 + it % nq
        load_tile(sm, Qs + stg * nblk * QBy, qkv[b, :, h * HD:(h + 1) * HD], i * BQ, T, HD, BQ)
        load_tile(sm, dOs + stg * nblk * QBy, dout[b, :, h * HD:(h + 1) * HD], i * BQ, T, HD, BQ)
        for x in range(BQ):
            tt = i * BQ + x
            Ls[stg * BQ + x] = lse[b, h, tt] if tt < T else np.inf
            Ds[stg * BQ + x] = Dr[b, h, tt] if tt < T else 0.0

    load_tile(sm, Ks, qkv[b, :, (H + kv) * HD:(H + kv + 1) * HD], kb0, T, HD, BK)
    load_tile(sm, Vs, qkv[b, :, (H + KV + kv) * HD:(H + KV + kv + 1) * HD], kb0, T, HD, BK)
    issue(0, 0)
    acc = [dict(dk=np.zeros((128, OD)), dv=np.zeros((128, OD))) for _ in range(NWG)]
    for it in range(total):
        stg = it & 1
        if it + 1 < total:
            issue(it + 1, stg ^ 1)
        qbase = (i0 + it % nq) * BQ
        if DQ:  # any dS element read before this tile's stores wrote it poisons dQ
            sm[dSs // 2:(dSs + 2 * QBy) // 2] = np.nan
        for wg in range(NWG):
            w0 = kb0 + wg * 64
            if w0 >= T or qbase + BQ - 1 < w0:
                assert wg == 1  # warpgroup 0's keys always see the tile
                continue
            k0 = w0 + warp * 16 + g
            k1 = k0 + 8
            Q = Qs + stg * nblk * QBy
            dO = dOs + stg * nblk * QBy
            L = Ls[stg * BQ:stg * BQ + BQ]
            Dd = Ds[stg * BQ:stg * BQ + BQ]
            stm = np.zeros((64, BQ))
            dpm = np.zeros((64, BQ))
            for ks in range(HD // 16):
                cb, kin = ks >> 2, (ks & 3) * 32
                bq = read_kmajor(sm, Q + cb * QBy + kin, BQ)
                bd = read_kmajor(sm, dO + cb * QBy + kin, BQ)
                stm += read_kmajor(sm, Ks + cb * KBy + wg * 64 * 128 + kin, 64) @ bq.T
                dpm += read_kmajor(sm, Vs + cb * KBy + wg * 64 * 128 + kin, 64) @ bd.T
            st = to_frag(stm, SN)
            dpt = to_frag(dpm, SN)
            diag = qbase < w0 + 63
            for nt in range(BQ // 8):
                ql = nt * 8 + tg * 2
                q = qbase + ql
                l0, l1, d0, d1 = L[ql], L[ql + 1], Dd[ql], Dd[ql + 1]
                p = [np.exp2(st[:, nt * 4 + 0] * sl2 - l0), np.exp2(st[:, nt * 4 + 1] * sl2 - l1),
                     np.exp2(st[:, nt * 4 + 2] * sl2 - l0), np.exp2(st[:, nt * 4 + 3] * sl2 - l1)]
                if diag:
                    p[0] = np.where(q < k0, 0.0, p[0])
                    p[1] = np.where(q + 1 < k0, 0.0, p[1])
                    p[2] = np.where(q < k1, 0.0, p[2])
                    p[3] = np.where(q + 1 < k1, 0.0, p[3])
                for c, dd in ((0, d0), (1, d1), (2, d0), (3, d1)):
                    st[:, nt * 4 + c] = p[c]
                    dpt[:, nt * 4 + c] = p[c] * (dpt[:, nt * 4 + c] - dd)
            dvm = from_frag(acc[wg]["dv"], OD, HD)
            dkm = from_frag(acc[wg]["dk"], OD, HD)
            for kc in range(BQ // 16):
                dvm += a_from_regs(pack_a(st, kc)) @ read_mnmajor(sm, dO + kc * 2048, HD, QBy)
                dkm += a_from_regs(pack_a(dpt, kc)) @ read_mnmajor(sm, Q + kc * 2048, HD, QBy)
                if DQ:  # dS^T's 8x8 blocks stored transposed, one stmatrix x4 per warp
                    sa = pack_a(dpt, kc)
                    for w in range(4):
                        addrs = []
                        for ln in range(32):
                            kl = w * 16 + (ln & 8)
                            q = kc * 16 + (ln >> 4) * 8 + (ln & 7)
                            addrs.append(dSs + wg * QBy + q * 128 + (((kl >> 3) ^ (q & 7)) << 4))
                        stsm_x4_trans(sm, addrs, sa[w * 32:(w + 1) * 32])
            acc[wg]["dv"] = to_frag(dvm, OD)
            acc[wg]["dk"] = to_frag(dkm, OD)
        if not DQ:
            continue
        # dQ^T = K^T dS^T per warpgroup (after the barrier), then the lane-pair swap and v4 atomics
        on1 = kb0 + 64 < T and qbase + BQ - 1 >= kb0 + 64
        h = kv * grp + it // nq
        Tp = ws_rows(T)
        for wg in range(NWG):
            mt, n0 = (wg, 0) if HD == 128 else (0, wg * 32)
            dqm = np.zeros((64, 32))
            for ks in range(8 if on1 else 4):
                cb, kin = ks >> 2, (ks & 3) * 32
                a = read_mnmajor(sm, Ks + mt * KBy + ks * 2048, 64, KBy).T  # A (64 x 16), MN-major
                bm = read_kmajor(sm, dSs + cb * QBy + n0 * 128 + kin, 32)  # B^T (32 x 16), K-major
                dqm += a @ bm.T
            dq = to_frag(dqm, 16)
            for th in range(128):
                odd = tg[th] & 1
                base = ((b * H + h) * HD + mt * 64 + warp[th] * 16 + g[th] + odd * 8) * Tp + \
                    qbase + n0 + (tg[th] >> 1) * 4
                for nt in range(4):
                    c = dq[th, nt * 4:nt * 4 + 4]
                    # __shfl_xor_sync(odd ? c[0] : c[2]), (odd ? c[1] : c[3]): the partner's parity
                    # is the other one
                    pc = dq[th ^ 1, nt * 4:nt * 4 + 4]
                    x0, x1 = (pc[2], pc[3]) if odd else (pc[0], pc[1])
                    v = [x0, x1, c[2], c[3]] if odd else [c[0], c[1], x0, x1]
                    red_v4(ws, base + nt * 8, np.array(v))
    store_dkdv(dqkv, acc, b, kv, kb0, T, H, KV, HD)


def dq_block(qkv, dout, lse, Dr, dqkv, B_, T, H, KV, HD, L, gh=1):
    OD = HD // 2
    QB, KB = BM * 128, BN * 128
    nblk = HD // 64
    sm = np.zeros((2 * (2 * BM * HD + 2 * 2 * BN * HD)) // 2)
    Qs = 0
    dOs = Qs + nblk * QB
    Ks = dOs + nblk * QB
    Vs = Ks + 2 * nblk * KB
    nqb = (T + BM - 1) // BM
    t, bh = tile_of(L, nqb, B_ * H, gh)
    qb = nqb - 1 - t
    b, h = divmod(bh, H)
    kv = h // (H // KV)
    sl2 = 1.4426950408889634 / math.sqrt(HD)
    scale = 1 / math.sqrt(HD)
    kk = qkv[b, :, (H + kv) * HD:(H + kv + 1) * HD]
    vv = qkv[b, :, (H + KV + kv) * HD:(H + KV + kv + 1) * HD]
    q0 = qb * BM
    nkv = (min(q0 + BM, T) + BN - 1) // BN
    load_tile(sm, Qs, qkv[b, :, h * HD:(h + 1) * HD], q0, T, HD, BM)
    load_tile(sm, dOs, dout[b, :, h * HD:(h + 1) * HD], q0, T, HD, BM)
    load_tile(sm, Ks, kk, 0, T, HD, BN)
    load_tile(sm, Vs, vv, 0, T, HD, BN)
    t = np.arange(128)
    warp, lane = t // 32, t % 32
    g, tg = lane // 4, lane % 4
    acc = [np.zeros((128, OD)) for _ in range(NWG)]
    for j in range(nkv):
        if j + 1 < nkv:
            st = (j + 1) & 1
            load_tile(sm, Ks + st * nblk * KB, kk, (j + 1) * BN, T, HD, BN)
            load_tile(sm, Vs + st * nblk * KB, vv, (j + 1) * BN, T, HD, BN)
        key0 = j * BN
        for wg in range(NWG):
            w0 = q0 + wg * 64
            if w0 >= T or key0 > w0 + 63:
                continue
            r0 = w0 + warp * 16 + g
            r1 = r0 + 8
            l0 = np.where(r0 < T, lse[b, h, np.minimum(r0, T - 1)], np.inf)
            l1 = np.where(r1 < T, lse[b, h, np.minimum(r1, T - 1)], np.inf)
            d0 = np.where(r0 < T, Dr[b, h, np.minimum(r0, T - 1)], 0.0)
            d1 = np.where(r1 < T, Dr[b, h, np.minimum(r1, T - 1)], 0.0)
            K = Ks + (j & 1) * nblk * KB
            V = Vs + (j & 1) * nblk * KB
            sm_ = np.zeros((64, 64))
            dpm = np.zeros((64, 64))
            for ks in range(HD // 16):
                cb, kin = ks >> 2, (ks & 3) * 32
                sm_ += read_kmajor(sm, Qs + cb * QB + wg * 64 * 128 + kin, 64) @ read_kmajor(sm, K + cb * KB + kin, 64).T
                dpm += read_kmajor(sm, dOs + cb * QB + wg * 64 * 128 + kin, 64) @ read_kmajor(sm, V + cb * KB + kin, 64).T
            s_ = to_frag(sm_, 32)
            dp = to_frag(dpm, 32)
            diag = key0 + BN - 1 > w0
            for nt in range(8):
                key = key0 + nt * 8 + tg * 2
                p = [np.exp2(s_[:, nt * 4 + 0] * sl2 - l0), np.exp2(s_[:, nt * 4 + 1] * sl2 - l0),
                     np.exp2(s_[:, nt * 4 + 2] * sl2 - l1), np.exp2(s_[:, nt * 4 + 3] * sl2 - l1)]
                if diag:
                    p[0] = np.where(key > r0, 0.0, p[0])
                    p[1] = np.where(key + 1 > r0, 0.0, p[1])
                    p[2] = np.where(key > r1, 0.0, p[2])
                    p[3] = np.where(key + 1 > r1, 0.0, p[3])
                for c, dd in ((0, d0), (1, d0), (2, d1), (3, d1)):
                    dp[:, nt * 4 + c] = p[c] * (dp[:, nt * 4 + c] - dd)
            dqm = from_frag(acc[wg], OD, HD)
            for kc in range(4):
                dqm += a_from_regs(pack_a(dp, kc)) @ read_mnmajor(sm, K + kc * 2048, HD, KB)
            acc[wg] = to_frag(dqm, OD)
    for wg in range(NWG):
        w0 = q0 + wg * 64
        r0 = w0 + warp * 16 + g
        r1 = r0 + 8
        for th in range(128):
            for half, row in ((0, r0[th]), (1, r1[th])):
                if row >= T:
                    continue
                for i in range(OD // 4):
                    c = i * 8 + tg[th] * 2
                    r = i * 4 + half * 2
                    dqkv[b, row, h * HD + c] += acc[wg][th, r] * scale
                    dqkv[b, row, h * HD + c + 1] += acc[wg][th, r + 1] * scale


def dq_out(ws, dqkv, B_, T, H, KV, HD):
    """fl3_dq_out_kernel: dqkv's query columns += ws (B, H, HD, Tp) / sqrt(HD), t < T."""
    Tp = ws_rows(T)
    w = ws.reshape(B_, H, HD, Tp)
    scale = 1 / math.sqrt(HD)
    for bh in range(B_ * H):
        b, h = bh // H, bh % H
        for t0 in range(0, Tp, 64):
            tile = w[b, h, :, t0:t0 + 64]
            for tt in range(64):
                if t0 + tt >= T:
                    break
                dqkv[b, t0 + tt, h * HD:(h + 1) * HD] += tile[:, tt] * scale


# ---- backward form 2 (fl3_bwd2_kernel, CT_FLASH3_BWD=2) ----
B2Q = 64


def b2_dqn(HD, own=False):
    return 64 if HD == 128 or own else 32


def b2_smem(HD, ndq=1, own=False):
    """fl3_bwd2_kernel's shared memory; ndq = 2 dQ^T staging buffers per warpgroup with
    CT_FLASH3_BWD2_OPT bit 1, own: bit 4 (hd 64: 64 x 64 dQ^T a warpgroup)"""
    KBy, QBy, NB = BK * 128, B2Q * 128, HD // 64
    o = dict(KBy=KBy, QBy=QBy, NB=NB, K=0)
    o["V"] = o["K"] + NB * KBy
    o["Q"] = o["V"] + NB * KBy
    o["dO"] = o["Q"] + 2 * NB * QBy
    o["dS"] = o["dO"] + 2 * NB * QBy
    o["dQ"] = o["dS"] + 2 * 2 * QBy
    o["DQBy"] = 64 * b2_dqn(HD, own) * 4
    o["L"] = o["dQ"] + NWG * ndq * o["DQBy"]
    o["Dd"] = o["L"] + 2 * B2Q * 4
    o["bar"] = o["Dd"] + 2 * B2Q * 4
    o["total"] = o["bar"] + 8 * 8
    return o


def tma_load3(sm, dst, src, x, y, rows, T):
    """cp.async.bulk.tensor.3d with CU_TENSOR_MAP_SWIZZLE_128B, box (64 columns, rows, 1) at
    (x, y) of src (T x width, one batch): box row r lands in the 128 bytes at dst + 128 r with
    address bits 4-6 ^= bits 7-9 (dst 1024-aligned, as the swizzle pattern repeats every 1024
    bytes); rows past T (out of bounds) are zeros."""
    assert dst % 1024 == 0
    for r in range(rows):
        vals = src[y + r, x:x + 64] if y + r < T else np.zeros(64)
        addr = dst + 128 * r + 2 * np.arange(64)
        sm[swz(addr) // 2] = vals


class WgmmaGroups:
    """One warpgroup's wgmma commit groups: wait_group(n) retires all but the n most recent;
    reading an accumulator asserts that the group writing it has retired."""

    def __init__(self):
        self.live = []

    def commit(self, *accs):
        self.live.append(set(accs))

    def wait(self, n):
        self.live = self.live[len(self.live) - n:] if n else []

    def read(self, acc):
        assert not any(acc in g for g in self.live), "%s read before its wgmma group retired" % acc


class BulkGroups:
    """One thread's cp.reduce.async.bulk groups: each reads its shared buffer when it completes,
    which may be any time after its issue (completion is forced by wait_group.read n: all but the
    n most recent); `chaos` completes random ones early. A store into a buffer that a pending group
    has yet to read is the race the wait discipline must rule out."""

    def __init__(self, rng):
        self.rng, self.pending, self.issued = rng, [], 0

    def issue(self, buf, fn):
        self.pending.append((buf, fn, self.issued))
        self.issued += 1

    def complete(self, i):
        self.pending.pop(i)[1]()

    def chaos(self):
        while self.pending and self.rng.random() < 0.5:
            self.complete(int(self.rng.integers(len(self.pending))))

    def wait_read(self, n):
        # the PTX ISA's wait_group.read n: every group but the n most recently *issued* has read
        # its buffer, whether or not a newer one completed first (counting the pending groups
        # instead let chaos leave step it - 2's group pending behind an early step it - 1)
        while self.pending and self.pending[0][2] < self.issued - n:
            self.complete(0)

    def store(self, buf):
        assert all(b != buf for b, _, _ in self.pending), "dQs buffer %d overwritten before read" % buf


def bwd2_block(qkv, dout, lse, Dr, dqkv, ws, B_, T, H, KV, HD, L, opt=0, rng=None):
    """fl3_bwd2_kernel<OPT = opt>: the producer's TMA loads and lse / D stores, then both consumer
    warpgroups' steps (dQ^T parts stored in fragment order and bulk-added into ws, the adds read
    at random times within the wait discipline), wgmma groups as the variant commits them."""
    DB, SPLIT, OWN = bool(opt & 1), bool(opt & 2), bool(opt & 4) and HD == 64
    assert not (OWN and DB)
    SL = b2_smem(HD, 2 if DB else 1, OWN)
    KBy, QBy, NB = SL["KBy"], SL["QBy"], SL["NB"]
    SN, OD, DQN = B2Q // 2, HD // 2, b2_dqn(HD, OWN)
    DQA = DQN // 2
    assert SL["total"] + 1024 <= 232448  # 227 KB: sm_90's most dynamic shared memory per block
    rng = rng or np.random.default_rng(0)
    bulk = [BulkGroups(rng) for _ in range(NWG)]
    wgg = [WgmmaGroups() for _ in range(NWG)]
    sm = np.zeros(SL["L"] // 2)
    Ls = np.zeros(2 * B2Q)
    Ds = np.zeros(2 * B2Q)
    kb, bkv = tile_of(L, (T + BK - 1) // BK, B_ * KV)  # key block 0 (every query) first
    b, kv = divmod(bkv, KV)
    grp = H // KV
    kb0 = kb * BK
    i0 = kb0 // B2Q
    nq = (T + B2Q - 1) // B2Q - i0
    total = grp * nq
    ntile = ws_rows(T) // 64
    W3 = (H + 2 * KV) * HD
    sl2 = 1.4426950408889634 / math.sqrt(HD)
    qkvb, doutb = qkv[b], dout[b]
    for cb in range(NB):
        tma_load3(sm, SL["K"] + cb * KBy, qkvb, (H + kv) * HD + cb * 64, kb0, BK, T)
        tma_load3(sm, SL["V"] + cb * KBy, qkvb, (H + KV + kv) * HD + cb * 64, kb0, BK, T)
    t = np.arange(128)
    warp, lane = t // 32, t % 32
    g, tg = lane // 4, lane % 4
    acc = [dict(dk=np.zeros((128, OD)), dv=np.zeros((128, OD))) for _ in range(NWG)]
    dQs = [[np.full(64 * DQN, np.nan) for _ in range(2 if DB else 1)] for _ in range(NWG)]
    for it in range(total):
        # producer (the ring's ordering is checked by sim_bwd2_barriers)
        stg, h, q0 = it & 1, kv * grp + it // nq, (i0 + it % nq) * B2Q
        for cb in range(NB):
            tma_load3(sm, SL["Q"] + (stg * NB + cb) * QBy, qkvb, h * HD + cb * 64, q0, B2Q, T)
            tma_load3(sm, SL["dO"] + (stg * NB + cb) * QBy, doutb, h * HD + cb * 64, q0, B2Q, T)
        for x in range(B2Q):
            tt = q0 + x
            Ls[stg * B2Q + x] = lse[b, h, tt] if tt < T else np.inf
            Ds[stg * B2Q + x] = Dr[b, h, tt] if tt < T else 0.0
        assert W3 * 2 % 16 == 0
        # consumers
        qt = i0 + it % nq
        qbase = qt * B2Q
        Q = SL["Q"] + stg * NB * QBy
        dO = SL["dO"] + stg * NB * QBy
        L = Ls[stg * B2Q:stg * B2Q + B2Q]
        Dd = Ds[stg * B2Q:stg * B2Q + B2Q]
        dSs = SL["dS"] + (it & 1) * 2 * QBy
        sm[dSs // 2:(dSs + 2 * QBy) // 2] = np.nan  # a read of a part not written this step shows
        for wg in range(NWG):
            w0 = kb0 + wg * 64
            if not (w0 < T and qbase + B2Q - 1 >= w0):
                assert wg == 1
                continue
            k0 = w0 + warp * 16 + g
            k1 = k0 + 8
            stm = np.zeros((64, B2Q))
            dpm = np.zeros((64, B2Q))
            for ks in range(HD // 16):
                cb, kin = ks >> 2, (ks & 3) * 32
                bq = read_kmajor(sm, Q + cb * QBy + kin, B2Q)
                bd = read_kmajor(sm, dO + cb * QBy + kin, B2Q)
                stm += read_kmajor(sm, SL["K"] + cb * KBy + wg * 64 * 128 + kin, 64) @ bq.T
                dpm += read_kmajor(sm, SL["V"] + cb * KBy + wg * 64 * 128 + kin, 64) @ bd.T
            wq = wgg[wg]
            if SPLIT:  # S^T and dP^T committed apart; wait 1 for P, wait 0 for dS
                wq.commit("st")
                wq.commit("dpt")
                wq.wait(1)
                wq.read("st")
            else:
                wq.commit("st", "dpt")
                wq.wait(0)
                wq.read("st")
            st = to_frag(stm, SN)
            dpt = to_frag(dpm, SN)
            diag = qbase < w0 + 63
            for nt in range(B2Q // 8):
                ql = nt * 8 + tg * 2
                q = qbase + ql
                l0, l1, d0, d1 = L[ql], L[ql + 1], Dd[ql], Dd[ql + 1]
                p = [np.exp2(st[:, nt * 4 + 0] * sl2 - l0), np.exp2(st[:, nt * 4 + 1] * sl2 - l1),
                     np.exp2(st[:, nt * 4 + 2] * sl2 - l0), np.exp2(st[:, nt * 4 + 3] * sl2 - l1)]
                if diag:
                    p[0] = np.where(q < k0, 0.0, p[0])
                    p[1] = np.where(q + 1 < k0, 0.0, p[1])
                    p[2] = np.where(q < k1, 0.0, p[2])
                    p[3] = np.where(q + 1 < k1, 0.0, p[3])
                for c in range(4):
                    st[:, nt * 4 + c] = p[c]
            if SPLIT:
                wq.wait(0)
            wq.read("dpt")
            for nt in range(B2Q // 8):
                ql = nt * 8 + tg * 2
                d0, d1 = Dd[ql], Dd[ql + 1]
                for c, dd in ((0, d0), (1, d1), (2, d0), (3, d1)):
                    dpt[:, nt * 4 + c] = st[:, nt * 4 + c] * (dpt[:, nt * 4 + c] - dd)
            dvm = from_frag(acc[wg]["dv"], OD, HD)
            dkm = from_frag(acc[wg]["dk"], OD, HD)
            for kc in range(B2Q // 16):
                sa = pack_a(dpt, kc)
                for w in range(4):
                    addrs = []
                    for ln in range(32):
                        kl = w * 16 + (ln & 8)
                        q = kc * 16 + (ln >> 4) * 8 + (ln & 7)
                        addrs.append(dSs + wg * QBy + q * 128 + (((kl >> 3) ^ (q & 7)) << 4))
                    stsm_x4_trans(sm, addrs, sa[w * 32:(w + 1) * 32])
            for kc in range(B2Q // 16):
                dvm += a_from_regs(pack_a(st, kc)) @ read_mnmajor(sm, dO + kc * 2048, HD, QBy)
                dkm += a_from_regs(pack_a(dpt, kc)) @ read_mnmajor(sm, Q + kc * 2048, HD, QBy)
            acc[wg]["dv"] = to_frag(dvm, OD)
            acc[wg]["dk"] = to_frag(dkm, OD)
            wq.commit("dv", "dk")
        # (double-buffered: tid 0's wait_group.read 1, then) bar.sync 1, 256; then dQ^T per
        # warpgroup, its fragments to dQs (buffer it % 2 when double-buffered), one bulk add each
        for wg in range(NWG):
            bulk[wg].chaos()
            if DB:
                bulk[wg].wait_read(1)
        on1 = kb0 + 64 < T and qbase + B2Q - 1 >= kb0 + 64
        for wg in range(NWG):
            mt, n0 = (wg, 0) if HD == 128 else (0, 0) if OWN else (0, wg * 32)
            if OWN and wg == 1 and not on1:
                wgg[wg].wait(0)
                continue  # bit 4: no dQ from keys that see none of the tile (no bulk add either)
            dqm = np.zeros((64, DQN))
            # bit 4: this warpgroup's own 4 key steps (its dS^T part only); else the block's
            for ks in (range(wg * 4, wg * 4 + 4) if OWN else range(8 if on1 else 4)):
                cb, kin = ks >> 2, (ks & 3) * 32
                a = read_mnmajor(sm, SL["K"] + mt * KBy + ks * 2048, 64, KBy).T
                bm = read_kmajor(sm, dSs + cb * QBy + n0 * 128 + kin, DQN)
                dqm += a @ bm.T
            wgg[wg].commit("dq")
            wgg[wg].wait(0)
            for a in ("dv", "dk", "dq"):
                wgg[wg].read(a)
            dq = to_frag(dqm, DQA)
            if not DB:
                bulk[wg].wait_read(0)
            bi = it & 1 if DB else 0
            bulk[wg].chaos()
            bulk[wg].store(bi)
            buf = dQs[wg][bi]
            buf[:] = np.nan
            for j in range(DQA // 4):
                for tid in range(128):
                    buf[(j * 128 + tid) * 4:(j * 128 + tid) * 4 + 4] = dq[tid, 4 * j:4 * j + 4]
            h = kv * grp + it // nq
            dst = (((b * H + h) * ntile + qt) * (1 if OWN else NWG) + (0 if OWN else wg)) * 64 * DQN
            assert dst % 4 == 0 and (64 * DQN * 4) % 16 == 0
            def add(dst=dst, buf=buf):  # cp.reduce.async.bulk .add.f32, reading buf when it runs
                ws[dst:dst + 64 * DQN] += buf
            bulk[wg].issue(bi, add)
            bulk[wg].chaos()
    for wg in range(NWG):
        bulk[wg].wait_read(0)  # bulk_wait0 before the block's shared memory goes
    store_dkdv(dqkv, acc, b, kv, kb0, T, H, KV, HD)


def dq_out2(ws, dqkv, B_, T, H, KV, HD, own=False):
    """fl3_dq_out2_kernel<OWN = own>: dqkv's query columns += ws / sqrt(HD), ws in
    fl3_bwd2_kernel's fragment order, looked up with the kernel's own formulas."""
    DQN = b2_dqn(HD, own)
    ntile = ws_rows(T) // 64
    scale = 1 / math.sqrt(HD)
    for bh in range(B_ * H):
        b, h = bh // H, bh % H
        for qt in range(ntile):
            f = ws[(bh * ntile + qt) * 64 * HD:(bh * ntile + qt + 1) * 64 * HD]
            for i in range(64 * (HD // 2)):
                tt, d = i // (HD // 2), i % (HD // 2) * 2
                t = qt * 64 + tt
                if t >= T:
                    break
                p = d // 64 if DQN == 64 else tt // 32
                col = tt if DQN == 64 else tt % 32
                for e in range(2):
                    row = (d + e) % 64
                    th = 32 * (row // 16) + 4 * (row % 8) + col % 8 // 2
                    r = 4 * (col // 8) + 2 * (row % 16 // 8) + col % 2
                    dqkv[b, t, h * HD + d + e] += f[p * 64 * DQN + ((r // 4) * 128 + th) * 4 + r % 4] * scale


class MBar:
    """An mbarrier: `count` arrivals plus the transaction bytes of arrive.expect_tx complete a
    phase; try_wait.parity(p) succeeds once the phase of parity p has completed (a fresh barrier's
    phase -1, parity 1, counts as completed)."""

    def __init__(self, count):
        self.count, self.pending, self.tx, self.phase = count, count, 0, 0

    def arrive(self, tx=0):
        self.tx += tx
        self.pending -= 1
        self._flip()

    def complete_tx(self, n):
        self.tx -= n
        self._flip()

    def _flip(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def done(self, parity):
        return (self.phase & 1) != parity


def sim_bwd2_barriers(total, seed):
    """The mbarrier protocol of fl3_bwd2_kernel, replayed with random interleavings of the
    producer warp and the 256 consumer threads (as 2 warpgroups: each thread's arrive is counted):
    full[s] 33 arrivals + the transaction bytes, empty[s] 256 arrivals, parities as the kernel
    computes them. Checks that nothing deadlocks, that every consumer reads stage it % 2 only
    after step it's data landed there, and that the producer never overwrites a stage a consumer
    has not released."""
    rng = np.random.default_rng(seed)

    Bar = MBar

    full, empty = [Bar(33), Bar(33)], [Bar(256), Bar(256)]
    stage = [None, None]  # the step whose data a stage holds
    prod = dict(it=0, state="wait")
    cons = [dict(it=0) for _ in range(NWG)]
    inflight = []  # TMA completions not yet landed: (stage, step, bytes)
    for _ in range(100000):
        moves = []
        if prod["it"] < total:
            moves.append("p")
        if inflight:
            moves.append("tma")
        moves += ["c%d" % w for w in range(NWG) if cons[w]["it"] < total]
        if not moves:
            return True
        m = moves[rng.integers(len(moves))]
        if m == "p":
            it = prod["it"]
            s = it & 1
            if not empty[s].done(((it >> 1) & 1) ^ 1):
                continue  # spinning
            assert all(c["it"] > it - 2 for c in cons), "producer refills a stage still being read"
            full[s].arrive(tx=2 * 64 * 128 * 2)
            inflight.append((s, it, 2 * 64 * 128 * 2))
            for _ in range(32):  # lse / D stores, then each lane's arrive
                full[s].arrive()
            stage[s] = None  # being overwritten
            prod["it"] += 1
        elif m == "tma":
            s, it, n = inflight.pop(0)
            stage[s] = it
            full[s].complete_tx(n)
        else:
            w = int(m[1:])
            c = cons[w]
            it = c["it"]
            s = it & 1
            if not full[s].done((it >> 1) & 1):
                continue
            if cons[1 - w]["it"] < it:  # bar.sync 1, 256 of step it - 1 waits for the other
                continue
            assert stage[s] == it, "consumer reads stage %d expecting step %d, holds %s" % (s, it, stage[s])
            # the warpgroup's 128 threads read, then arrive on empty (after their wgmmas)
            for _ in range(128):
                empty[s].arrive()
            c["it"] += 1
    return False  # no progress in 100000 moves: a deadlock


def bulk_selftest():
    """The dQs race check can fail: one buffer with wait_group.read 1 (the double buffer's wait
    without its second buffer) must be caught."""
    rng = np.random.default_rng(7)
    caught = False
    for _ in range(50):
        bg = BulkGroups(rng)
        try:
            for it in range(6):
                bg.wait_read(1)
                bg.store(0)
                bg.issue(0, lambda: None)
                bg.chaos()
        except AssertionError:
            caught = True
            break
    print("%s backward form 2: a single dQs buffer waited with wait_group.read 1 is caught" %
          ("ok  " if caught else "FAIL"))
    return caught


def run_bwd2(B_, T, H, KV, HD, seed, opt=0):
    rng = np.random.default_rng(seed)
    qkv = rng.standard_normal((B_, T, (H + 2 * KV) * HD))
    dout = rng.standard_normal((B_, T, H * HD))
    out, lse = reference(qkv, B_, T, H, KV, HD)
    Dr = np.zeros((B_, H, T))
    for h in range(H):
        Dr[:, h, :] = (dout[:, :, h * HD:(h + 1) * HD] * out[:, :, h * HD:(h + 1) * HD]).sum(axis=2)
    dqkv = np.zeros_like(qkv)
    ws = np.zeros(B_ * H * HD * ws_rows(T))
    for L in blocks((T + BK - 1) // BK, B_ * KV):
        bwd2_block(qkv, dout, lse, Dr, dqkv, ws, B_, T, H, KV, HD, L, opt, rng)
    untouched = np.abs(dqkv[:, :, :H * HD]).max() == 0 and not np.isnan(ws).any()
    dq_out2(ws, dqkv, B_, T, H, KV, HD, bool(opt & 4) and HD == 64)
    rq, rk, rv = reference_grads(qkv, dout, B_, T, H, KV, HD)
    eq = np.abs(dqkv[:, :, :H * HD] - rq).max()
    ek = np.abs(dqkv[:, :, H * HD:(H + KV) * HD] - rk).max()
    ev = np.abs(dqkv[:, :, (H + KV) * HD:] - rv).max()
    ok = eq < 1e-9 and ek < 1e-9 and ev < 1e-9 and untouched
    print("%s backward form 2 (CT_FLASH3_BWD=2, OPT %d) B%d T%d H%d KV%d hd%d: max |dQ - ref| %.2e, "
          "|dK - ref| %.2e, |dV - ref| %.2e" % ("ok  " if ok else "FAIL", opt, B_, T, H, KV, HD, eq, ek,
                                                ev))
    return ok


def reference_grads(qkv, dout, B_, T, H, KV, HD):
    dk = np.zeros((B_, T, KV * HD))
    dv = np.zeros((B_, T, KV * HD))
    dq = np.zeros((B_, T, H * HD))
    for b in range(B_):
        for h in range(H):
            kv = h // (H // KV)
            q = qkv[b, :, h * HD:(h + 1) * HD]
            k = qkv[b, :, (H + kv) * HD:(H + kv + 1) * HD]
            v = qkv[b, :, (H + KV + kv) * HD:(H + KV + kv + 1) * HD]
            s = q @ k.T / math.sqrt(HD)
            s[np.triu(np.ones((T, T), bool), 1)] = -np.inf
            p = np.exp(s - s.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            do = dout[b, :, h * HD:(h + 1) * HD]
            o = p @ v
            dp = do @ v.T
            ds = p * (dp - (do * o).sum(axis=1, keepdims=True))
            dv[b, :, kv * HD:(kv + 1) * HD] += p.T @ do
            dk[b, :, kv * HD:(kv + 1) * HD] += ds.T @ q / math.sqrt(HD)
            dq[b, :, h * HD:(h + 1) * HD] = ds @ k / math.sqrt(HD)
    return dq, dk, dv


def run_bwd(B_, T, H, KV, HD, seed, fused=False):
    rng = np.random.default_rng(seed)
    qkv = rng.standard_normal((B_, T, (H + 2 * KV) * HD))
    dout = rng.standard_normal((B_, T, H * HD))
    out, lse = reference(qkv, B_, T, H, KV, HD)
    Dr = np.zeros((B_, H, T))
    for h in range(H):
        Dr[:, h, :] = (dout[:, :, h * HD:(h + 1) * HD] * out[:, :, h * HD:(h + 1) * HD]).sum(axis=2)
    dqkv = np.zeros_like(qkv)
    ws = np.zeros(B_ * H * HD * ws_rows(T)) if fused else None
    for L in blocks((T + BK - 1) // BK, B_ * KV):
        dkdv_block(qkv, dout, lse, Dr, dqkv, B_, T, H, KV, HD, L, ws)
    untouched = np.abs(dqkv[:, :, :H * HD]).max() == 0  # dK/dV must leave the query columns
    if fused:
        untouched = untouched and not np.isnan(ws).any()
        dq_out(ws, dqkv, B_, T, H, KV, HD)
    else:
        for L in blocks((T + BM - 1) // BM, B_ * H):
            dq_block(qkv, dout, lse, Dr, dqkv, B_, T, H, KV, HD, L)
    rq, rk, rv = reference_grads(qkv, dout, B_, T, H, KV, HD)
    eq = np.abs(dqkv[:, :, :H * HD] - rq).max()
    ek = np.abs(dqkv[:, :, H * HD:(H + KV) * HD] - rk).max()
    ev = np.abs(dqkv[:, :, (H + KV) * HD:] - rv).max()
    ok = eq < 1e-9 and ek < 1e-9 and ev < 1e-9 and untouched
    print("%s backward%s B%d T%d H%d KV%d hd%d: max |dQ - ref| %.2e, |dK - ref| %.2e, |dV - ref| %.2e" %
          ("ok  " if ok else "FAIL", " (fused, dQ atomics)" if fused else "", B_, T, H, KV, HD, eq,
           ek, ev))
    return ok


def reference(qkv, B_, T, H, KV, HD):
    out = np.zeros((B_, T, H * HD))
    lse = np.zeros((B_, H, T))
    for b in range(B_):
        for h in range(H):
            kv = h // (H // KV)
            q = qkv[b, :, h * HD:(h + 1) * HD]
            k = qkv[b, :, (H + kv) * HD:(H + kv + 1) * HD]
            v = qkv[b, :, (H + KV + kv) * HD:(H + KV + kv + 1) * HD]
            s = q @ k.T / math.sqrt(HD)
            s[np.triu(np.ones((T, T), bool), 1)] = -np.inf
            m = s.max(axis=1, keepdims=True)
            e = np.exp(s - m)
            out[b, :, h * HD:(h + 1) * HD] = (e / e.sum(axis=1, keepdims=True)) @ v
            lse[b, h] = (m[:, 0] + np.log(e.sum(axis=1))) / math.log(2)
    return out, lse


def run(B_, T, H, KV, HD, seed, block=kernel_block, label="", gh=1):
    """One forward form (its per-block replay `block`) over a whole problem against plain
    attention, gh heads' tiles interleaved in the grid (fwd_group)."""
    rng = np.random.default_rng(seed)
    qkv = rng.standard_normal((B_, T, (H + 2 * KV) * HD))
    out = np.full((B_, T, H * HD), np.nan)
    lse = np.full((B_, H, T), np.nan)
    for L in blocks((T + BM - 1) // BM, B_ * H, gh):
        block(qkv, out, lse, B_, T, H, KV, HD, L, gh)
    ro, rl = reference(qkv, B_, T, H, KV, HD)
    eo = np.abs(out - ro).max() if not np.isnan(out).any() else np.inf
    el = np.abs(lse - rl).max() if not np.isnan(lse).any() else np.inf
    ok = eo < 1e-9 and el < 1e-9
    print("%s %sB%d T%d H%d KV%d hd%d: max |out - ref| %.2e, max |lse - ref| %.2e" %
          ("ok  " if ok else "FAIL", label, B_, T, H, KV, HD, eo, el))
    return ok


# ---- forward form 2 (fl3_fwd2_kernel, CT_FLASH3_FWD=2) ----
F2N = 128


def f2_smem(HD):
    NB, QBy, KBy = HD // 64, BM * 128, F2N * 128
    o = dict(NB=NB, QBy=QBy, KBy=KBy, Q=0)
    o["K"] = o["Q"] + NB * QBy
    o["V"] = o["K"] + 2 * NB * KBy
    o["bar"] = o["V"] + 2 * NB * KBy
    o["total"] = o["bar"] + 9 * 8
    return o


def f2_producer_ops(nkv):
    """The producer thread's loads in issue order: K_0, then K_{j+1} before V_j."""
    ops = [("K", 0)]
    for j in range(nkv):
        if j + 1 < nkv:
            ops.append(("K", j + 1))
        ops.append(("V", j))
    return ops


def fwd2_block(qkv, out, lse, B_, T, H, KV, HD, L, gh=1):
    """fl3_fwd2_kernel for one block. The producer is replayed as eagerly as the empty barriers
    allow (a load of tile t into stage t % 2 as soon as tile t - 2's release is complete, i.e. both
    consumer warpgroups have arrived), so a read of a stage after its release would see the next
    tile; the PV wgmma is evaluated at the wait that retires it (the latest moment it may read V),
    S at the wait right after its issue."""
    SL = f2_smem(HD)
    NB, QBy, KBy = SL["NB"], SL["QBy"], SL["KBy"]
    OD, SN = HD // 2, F2N // 2
    assert SL["total"] + 1024 <= 227 * 1024 and SL["bar"] % 1024 == 0 and KBy % 1024 == 0
    sm = np.full(SL["bar"] // 2, np.nan)
    nqb = (T + BM - 1) // BM
    t, bh = tile_of(L, nqb, B_ * H, gh)
    qb = nqb - 1 - t
    q0, nkv = qb * BM, qb + 1
    assert nkv == (min(q0 + BM, T) + F2N - 1) // F2N  # the kernel's shortcut (F2N == BM)
    b, h = divmod(bh, H)
    kv = h // (H // KV)
    sl2 = 1.4426950408889634 / math.sqrt(HD)
    qkvb = qkv[b]
    for cb in range(NB):
        tma_load3(sm, SL["Q"] + cb * QBy, qkvb, h * HD + cb * 64, q0, BM, T)
    holds = {"K": [None, None], "V": [None, None]}
    released = {"K": set(), "V": set()}
    ops = f2_producer_ops(nkv)

    def produce():
        while ops:
            kind, t = ops[0]
            if t >= 2 and t - 2 not in released[kind]:
                return
            ops.pop(0)
            st = t & 1
            col = (H + kv) * HD if kind == "K" else (H + KV + kv) * HD
            for cb in range(NB):
                tma_load3(sm, SL[kind] + (st * NB + cb) * KBy, qkvb, col + cb * 64, t * F2N, F2N, T)
            holds[kind][st] = t

    def release(kind, t):  # both warpgroups have arrived (they run the same steps)
        released[kind].add(t)
        produce()

    produce()
    t_ = np.arange(128)
    warp, lane = t_ // 32, t_ % 32
    g, tg = lane // 4, lane % 4
    quad = t_ // 4
    W = []
    for wg in range(NWG):
        r0 = q0 + wg * 64 + warp * 16 + g
        W.append(dict(r0=r0, r1=r0 + 8, o=np.zeros((128, OD)), s=None, p=None,
                      m0=np.full(128, -np.inf), m1=np.full(128, -np.inf), l0=np.zeros(128),
                      l1=np.zeros(128), a0=None, a1=None, pending=None))

    def qk(w, wg, t):
        assert holds["K"][t & 1] == t, "S_%d reads a K stage holding %s" % (t, holds["K"][t & 1])
        K = SL["K"] + (t & 1) * NB * KBy
        smat = np.zeros((64, F2N))
        for ks in range(HD // 16):
            cb, kin = ks >> 2, (ks & 3) * 32
            a = read_kmajor(sm, SL["Q"] + wg * 64 * 128 + cb * QBy + kin, 64)
            bm = read_kmajor(sm, K + cb * KBy + kin, F2N)
            smat += a @ bm.T
        w["s"] = to_frag(smat, SN)

    def softmax(w, t):
        s_, r0, r1 = w["s"], w["r0"], w["r1"]
        if t == nkv - 1:
            for nt in range(SN // 4):
                key = t * F2N + nt * 8 + tg * 2
                s_[key > r0, nt * 4 + 0] = -np.inf
                s_[key + 1 > r0, nt * 4 + 1] = -np.inf
                s_[key > r1, nt * 4 + 2] = -np.inf
                s_[key + 1 > r1, nt * 4 + 3] = -np.inf
        mx0 = np.max(s_[:, [nt * 4 + c for nt in range(SN // 4) for c in (0, 1)]], axis=1)
        mx1 = np.max(s_[:, [nt * 4 + c for nt in range(SN // 4) for c in (2, 3)]], axis=1)
        mx0 = np.array([mx0[quad == qd].max() for qd in quad])
        mx1 = np.array([mx1[quad == qd].max() for qd in quad])
        n0 = np.maximum(w["m0"], mx0 * sl2)
        n1 = np.maximum(w["m1"], mx1 * sl2)
        assert np.isfinite(n0).all() and np.isfinite(n1).all()  # every row sees a key each tile
        w["a0"], w["a1"] = np.exp2(w["m0"] - n0), np.exp2(w["m1"] - n1)
        w["m0"], w["m1"] = n0, n1
        ls0, ls1 = np.zeros(128), np.zeros(128)
        for nt in range(SN // 4):
            for c, nn in ((0, n0), (1, n0), (2, n1), (3, n1)):
                s_[:, nt * 4 + c] = np.exp2(s_[:, nt * 4 + c] * sl2 - nn)
            ls0 += s_[:, nt * 4 + 0] + s_[:, nt * 4 + 1]
            ls1 += s_[:, nt * 4 + 2] + s_[:, nt * 4 + 3]
        w["l0"] = w["l0"] * w["a0"] + ls0
        w["l1"] = w["l1"] * w["a1"] + ls1

    def rescale_pack(w):
        o = w["o"]
        o[:, 0::4] *= w["a0"][:, None]
        o[:, 1::4] *= w["a0"][:, None]
        o[:, 2::4] *= w["a1"][:, None]
        o[:, 3::4] *= w["a1"][:, None]
        w["p"] = [pack_a(w["s"], kc) for kc in range(F2N // 16)]
        w["s"] = None  # S's registers are rewritten by the next QK^T

    def issue_pv(w, t):
        w["pending"] = (t, w["p"])

    def wait_pv(w):  # the wgmma.wait_group that retires the PV group: it has read V until here
        if w["pending"] is None:
            return
        t, p = w["pending"]
        assert holds["V"][t & 1] == t, "PV_%d reads a V stage holding %s" % (t, holds["V"][t & 1])
        V = SL["V"] + (t & 1) * NB * KBy
        omat = from_frag(w["o"], OD, HD)
        for kc in range(F2N // 16):
            omat += a_from_regs(p[kc]) @ read_mnmajor(sm, V + kc * 2048, HD, KBy)
        w["o"] = to_frag(omat, OD)
        w["pending"] = None

    # tile 0
    for wg in range(NWG):
        qk(W[wg], wg, 0)
    release("K", 0)
    for wg in range(NWG):
        softmax(W[wg], 0)
    for j in range(1, nkv):
        for wg in range(NWG):
            wait_pv(W[wg])
        if j > 1:
            release("V", j - 2)
        for wg in range(NWG):
            rescale_pack(W[wg])
            qk(W[wg], wg, j)
            issue_pv(W[wg], j - 1)
        release("K", j)  # after wait_group 1: S_j done, the PV group may still run
        for wg in range(NWG):
            softmax(W[wg], j)
    for wg in range(NWG):
        w = W[wg]
        wait_pv(w)
        rescale_pack(w)
        issue_pv(w, nkv - 1)
        wait_pv(w)
        # fwd_store
        l0 = np.array([w["l0"][quad == qd].sum() for qd in quad])
        l1 = np.array([w["l1"][quad == qd].sum() for qd in quad])
        fwd_store(out, lse, w["o"], l0, l1, w["m0"], w["m1"], w["r0"], w["r1"], tg, b, h, HD, T)


def run_fwd2(B_, T, H, KV, HD, seed, gh=1):
    return run(B_, T, H, KV, HD, seed, fwd2_block, "forward form 2 (CT_FLASH3_FWD=2) ", gh)


def sim_fwd2_barriers(nkv, seed):
    """fl3_fwd2_kernel's mbarriers under random interleavings of the producer thread, the TMA
    completions and the two consumer warpgroups (each warpgroup's 128 arrivals counted): qbar,
    fullk / fullv (1 arrival + bytes), emptyk / emptyv (256 arrivals), parities as the kernel
    computes them. Checks that nothing deadlocks and that every read of a stage (S_j's of K_j, the
    PV group's of V_j from its issue to the wait that retires it) finds that tile there, never
    one being overwritten."""
    rng = np.random.default_rng(seed)
    BY = 128 * 128 * 2  # bytes of a tile at hd 128 (any count works if both sides agree)
    qbar = MBar(1)
    full = {"K": [MBar(1), MBar(1)], "V": [MBar(1), MBar(1)]}
    empty = {"K": [MBar(256), MBar(256)], "V": [MBar(256), MBar(256)]}
    holds = {"K": [None, None], "V": [None, None]}
    inflight = []  # (kind, stage, tile, bytes) or ("Q", ...)
    ops = [("Q", 0)] + f2_producer_ops(nkv)

    # each consumer warpgroup: a list of steps ("wait", bar, parity) | ("read", kind, tile) |
    # ("arrive", bar) | ("check", kind, tile): the kernel's order of waits, reads and arrivals
    def steps():
        st = [("wait", qbar, 0), ("wait", full["K"][0], 0), ("read", "K", 0),
              ("arrive", empty["K"][0])]
        for j in range(1, nkv):
            s, sp = j & 1, (j & 1) ^ 1
            st += [("wait", full["K"][s], (j >> 1) & 1), ("wait", full["V"][sp], ((j - 1) >> 1) & 1)]
            if j > 1:  # wait_group 0 retires P_{j-2} V_{j-2}: V_{j-2} read until here
                st += [("read", "V", j - 2), ("arrive", empty["V"][s])]
            st += [("read", "K", j), ("read", "V", j - 1), ("arrive", empty["K"][s])]
        if nkv > 1:
            st += [("read", "V", nkv - 2)]
        st += [("wait", full["V"][(nkv - 1) & 1], ((nkv - 1) >> 1) & 1), ("read", "V", nkv - 1)]
        return st

    cons = [dict(steps=steps(), at=0) for _ in range(NWG)]
    for _ in range(200000):
        moves = []
        if ops:
            moves.append("p")
        if inflight:
            moves.append("tma")
        moves += ["c%d" % w for w in range(NWG) if cons[w]["at"] < len(cons[w]["steps"])]
        if not moves:
            return True
        m = moves[rng.integers(len(moves))]
        if m == "p":
            kind, t = ops[0]
            if kind == "Q":
                qbar.arrive(tx=BY)
                inflight.append(("Q", 0, 0, BY))
            else:
                s = t & 1
                if not empty[kind][s].done(((t >> 1) & 1) ^ 1):
                    continue  # spinning
                full[kind][s].arrive(tx=BY)
                holds[kind][s] = None  # being overwritten
                inflight.append((kind, s, t, BY))
            ops.pop(0)
        elif m == "tma":
            kind, s, t, n = inflight.pop(rng.integers(len(inflight)))  # TMA loads land in any order
            if kind == "Q":
                qbar.complete_tx(n)
            else:
                holds[kind][s] = t
                full[kind][s].complete_tx(n)
        else:
            c = cons[int(m[1:])]
            step = c["steps"][c["at"]]
            if step[0] == "wait":
                if not step[1].done(step[2]):
                    continue
            elif step[0] == "read":
                kind, t = step[1], step[2]
                assert holds[kind][t & 1] == t, "reads %s_%d, stage holds %s" % (kind, t, holds[kind][t & 1])
            else:
                for _ in range(128):
                    step[1].arrive()
            c["at"] += 1
    return False


def f2_checks():
    good = True
    for c in [(1, 200, 2, 1, 64, 1), (1, 130, 2, 2, 128, 2), (2, 64, 1, 1, 64, 3),
              (1, 257, 4, 2, 128, 4), (1, 520, 2, 1, 64, 5), (1, 400, 8, 1, 128, 6)]:
        good = run_fwd2(*c) and good
        good = run_fwd2(*c, gh=3) and good  # 3 heads' tiles interleaved, the last group partial
    bars = all(sim_fwd2_barriers(nkv, seed) for nkv in (1, 2, 3, 4, 7, 16) for seed in range(40))
    print("%s forward form 2: mbarrier rings, 240 random interleavings of 1-16 key tiles" %
          ("ok  " if bars else "FAIL"))
    return good and bars


if __name__ == "__main__":
    cases = [(1, 200, 2, 1, 64, 1), (1, 130, 2, 2, 128, 2), (2, 64, 1, 1, 64, 3), (1, 257, 4, 2, 128, 4)]
    good = all([run(*c) for c in cases])
    # forward block orders: 8 heads a group (partial at 2 or 4 heads), 3 (1, 130, 2 ...: one
    # partial group; (2, 64, 1 ...): 2 heads in a group of 3)
    good = all([run(*c, gh=g) for g in (3, 8) for c in cases]) and good
    good = all([run_bwd(*c) for c in cases]) and good
    good = all([run_bwd(*c, fused=True) for c in cases]) and good
    good = all([run_bwd2(*c, opt=o) for o in (0, 1, 2, 3, 4, 6) for c in cases]) and good
    # bit 4 (hd 64 only; at hd 128 it is OPT 0 / 2): GQA, T off the tiles, warpgroup 1 idle
    good = all([run_bwd2(1, 257, 4, 2, 64, 7, opt=o) for o in (4, 6)]) and good
    good = bulk_selftest() and good
    bars = all(sim_bwd2_barriers(total, seed) for total in (1, 2, 3, 7, 20) for seed in range(50))
    print("%s backward form 2: mbarrier ring, 250 random interleavings of 1-20 steps" %
          ("ok  " if bars else "FAIL"))
    good = good and bars
    good = f2_checks() and good
    sys.exit(0 if good else 1)

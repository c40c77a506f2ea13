// A decode token's routed experts, gate|up -> GLU -> down, as one launch (Hopper clusters).
#pragma once

#include "cuda/elementwise.cuh"
#include "cuda/matmul.cuh"

namespace frink::cuda {

// The products moe_slot_experts would launch (gu: the gate and up expert products, or one
// fused gate_up, of one token with h already prepared; down: the down product, its input the
// GLU g of them) in one kernel, or false where it cannot (then nothing was launched):
// one token, the GLU plain (SiLU or GELU), no bias or scale, the types it instantiates
// (Q4_0 throughout, Q4_K gate/up with a Q4_K or Q6_K down), a cluster size whose blocks hold
// their experts' rows in shared memory with every slot's cluster resident at once, sm_90.
// y = down.y, slot by slot, as the separate products write it; the GLU's values never leave
// the chip.
bool launch_fused_experts(const MatmulParams* gu, int n_gu, const MatmulParams& down, const GluParams& g);

}  // namespace frink::cuda

#pragma once
// GradWrite: how a kernel or a layer writes a gradient it computes.
//
//   add     dst += value: what accumulation needs (micro-batches, a second
//           backward after one forward, a reduction into a shard that holds
//           gradients already);
//   assign  dst  = value: every element written whatever it held, so the
//           caller need not zero it first;
//   none    nothing written (accumulate_with_stats: statistics of dst only).
//
// Why assign matters: after zero_grad() the first backward of a step would
// otherwise add into zeros, which costs a fill of every gradient element and,
// in each weight-gradient GEMM, a read of the old value (beta = 1): two passes
// over the f32 gradients (~2 GiB each for a 536M model) per step that carry no
// information. Layers take add or assign (Layer::set_grad_write); the engine
// asks for assign only where the gradients hold nothing yet
// (ShardedGroup::grads_unwritten) and the layer can write them all
// (Layer::assigns_grads).
namespace kshard {

enum class GradWrite { add, assign, none };

}  // namespace kshard

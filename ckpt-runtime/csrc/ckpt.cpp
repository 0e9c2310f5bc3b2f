// The C++ half of `ckpt::checkpoint`: a libtorch autograd node that recomputes a Rust
// closure in backward (the counting CPU allocator and CUDA statistics are in
// csrc/memory.cpp, the C API of generator and autocast state in csrc/state.cpp).
//
// Rules of this file (the boundary's types and helpers are csrc/ffi.h):
// - every fallible `extern "C"` entry point runs in `ckpt::guarded`, which reports every
//   C++ exception through the caller's error slot; nothing throws across the boundary;
// - Rust callbacks are called through `ckpt::call_rust`, which turns the raw message
//   they report into a std::runtime_error;
// - the node owns its Rust closure through `Segment`, whose destructor drops it when
//   the autograd graph frees the node.

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <ATen/core/ivalue.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/alignment.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>

#include "common.h"
#include "ffi.h"
#include "policy.h"

#include "extra.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

using ckpt::AutocastState;
using ckpt::check;
using ckpt::cuda_present;
using ckpt::fail;
using ckpt::install_counting_allocator;
using ckpt::RngState;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

// ---------------------------------------------------------------------------------
// The segment: the Rust closure and what forward recorded for its recompute.

struct OutputMeta {
  std::vector<int64_t> sizes;
  at::ScalarType dtype;
  c10::Device device;
};

std::string describe(const OutputMeta& m) {
  std::string s = "[";
  for (size_t i = 0; i < m.sizes.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(m.sizes[i]);
  }
  s += "] ";
  s += c10::toString(m.dtype);
  s += " on ";
  s += m.device.str();
  return s;
}

std::atomic<int64_t> g_live_segments{0};

struct Segment : torch::CustomClassHolder {
  ckpt_callbacks rust;  // the closure (`rust.user`), owned
  std::string name;
  bool preserve_rng_state = true;
  bool determinism_check = true;

  bool has_rng = false;
  RngState rng;
  AutocastState autocast;
  std::vector<OutputMeta> outputs;
  // The captured parameters that are inputs of the node (csrc/params.cpp), after the stash.
  std::vector<at::Tensor> params;
  // What the selective-checkpointing policy kept from forward (null: recompute all).
  std::shared_ptr<ckpt_policy::Cache> policy;

  explicit Segment(const ckpt_callbacks& r) : rust(r) { g_live_segments.fetch_add(1); }
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment() override {
    rust.drop(rust.user);  // the Rust side catches panics of the closure's destructor
    g_live_segments.fetch_sub(1);
  }
};

// Calls the closure on `inputs`; throws std::runtime_error with the closure's message on
// failure (the Rust side names the segment in it).
std::vector<at::Tensor> call_closure(const Segment& seg, bool recompute,
                                     const std::vector<at::Tensor>& inputs) {
  std::vector<ckpt_tensor> raw;
  raw.reserve(inputs.size());
  try {
    for (const auto& t : inputs) raw.push_back(new at::Tensor(t));
  } catch (...) {
    for (auto* p : raw) delete p;
    throw;
  }
  // The callback takes ownership of every pointer in `raw`, on success and on failure.
  return ckpt::call_rust([&](const ckpt_ctx* ctx) {
    seg.rust.run(seg.rust.user, recompute ? 1 : 0, raw.data(), raw.size(), ctx);
  });
}

// Fork semantics (torch.random.fork_rng): remember the current state, install the
// forward's, and put the current one back when the recompute is over.
struct RecomputeStateGuard {
  const Segment& seg;
  // The forward updated batch norm's running statistics; the recompute must not again
  // (csrc/buffers.cpp).
  ckpt::FrozenRunningStats frozen_stats;
  bool restore_rng = false;
  RngState saved_rng;
  AutocastState saved_autocast;

  explicit RecomputeStateGuard(const Segment& s) : seg(s) {
    saved_autocast = AutocastState::capture();
    // An autocast region, as `torch.autocast`'s context manager opens one: the cast
    // cache (bf16/fp16 copies of leaf tensors, the weights) is cleared when the
    // outermost region ends. Without this, the casts made by the recompute outlived it
    // and the next forward under autocast reused copies of the old weights.
    at::autocast::increment_nesting();
    // Inside an enclosing region (backward run under autocast), the cache may hold casts
    // of the segment's parameters made before the recompute: their graph leads to the
    // parameters' accumulators, not to the recompute's capture nodes (csrc/params.cpp).
    // The recompute casts afresh; the enclosing region's later uses cast again too.
    if (!seg.params.empty()) at::autocast::clear_cache();
    if (seg.has_rng) {
      std::set<c10::DeviceIndex> devices;
      for (const auto& [idx, st] : seg.rng.cuda) devices.insert(idx);
      saved_rng = RngState::capture(devices, seg.rng.cpu.defined());
      restore_rng = true;
      seg.rng.restore();
    }
    seg.autocast.apply();
  }
  ~RecomputeStateGuard() {
    try {
      if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
      saved_autocast.apply();
      if (restore_rng) saved_rng.restore();
    } catch (...) {
      // A destructor must not throw; setting a state that was read a moment ago
      // does not fail in practice.
    }
  }
};

bool differentiable(const at::Tensor& t) {
  return at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type());
}

// ---------------------------------------------------------------------------------
// The autograd function (decision 1)

// The segment's forward run, under no_grad: the closure on `in`, with what its recompute
// needs recorded in `seg` (generator states it drew from, autocast state, what the
// selective policy keeps). `seg->params` is narrowed to the parameters the run read
// (csrc/params.cpp), so that the node has edges only to their accumulators: an edge to a
// parameter the segment does not use would hold that parameter's accumulation back until
// the segment's backward.
std::vector<at::Tensor> run_forward(Segment& seg, const std::vector<at::Tensor>& in) {
  at::AutoGradMode no_grad(false);
  // Inside an enclosing segment's recompute, this run's ops are not the closure turning
  // grad off.
  ckpt::GradOffWatch::Pause unwatched;
  ckpt::RngProbe rng_before;
  if (seg.preserve_rng_state) {
    std::set<c10::DeviceIndex> devices;
    for (const auto& t : in) {
      if (t.device().is_cuda()) devices.insert(t.device().index());
    }
    if (devices.empty() && cuda_present()) {
      devices.insert(at::detail::getCUDAHooks().getCurrentDevice());
    }
    rng_before = ckpt::RngProbe::take(devices);
  }
  seg.autocast = AutocastState::capture();
  seg.policy = ckpt_policy::cache_for_new_segment(seg.preserve_rng_state);

  std::vector<at::Tensor> outs;
  {
    ckpt_policy::Scope record(seg.policy.get(), /*replay=*/false);
    ckpt::ParamUsage usage(seg.params);
    outs = call_closure(seg, false, in);
    seg.params = usage.used();
  }

  // Only the generators the forward drew from need their state kept (csrc/rng.cpp).
  if (seg.preserve_rng_state) {
    rng_before.moved(seg.rng.cpu, seg.rng.cuda);
    seg.has_rng = seg.rng.cpu.defined() || !seg.rng.cuda.empty();
  }
  return outs;
}

struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  // `dummy` requires grad, so the node joins the graph even when no input does
  // (decision 3); its gradient is always undefined. `params` (the same as `seg->params`)
  // are inputs so that the node has edges to their accumulators; they are not saved.
  // `forward_outs` is what `run_forward` returned, taken over here.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& dummy,
                               at::TensorList inputs, at::TensorList params,
                               c10::intrusive_ptr<Segment> seg, void* forward_outs) {
    (void)dummy;
    (void)params;
    std::vector<at::Tensor> in(inputs.begin(), inputs.end());
    std::vector<at::Tensor> outs = std::move(*static_cast<std::vector<at::Tensor>*>(forward_outs));

    // The node becomes the grad_fn of every output that is not an input. An output that
    // is a tensor from outside the segment (a captured parameter or buffer returned as
    // is, or by an op that returns its argument: `shallow_clone`, `to_device` to the
    // same device) would be rewired: a parameter would stop being a leaf, and the
    // recompute would backpropagate into this very node (a deadlock). Forward runs under
    // no_grad, so a tensor the closure created is referenced only by `outs`; anything
    // referenced elsewhere too is returned as an alias (a new tensor on the same storage)
    // instead. Outputs that are inputs are left to autograd, which returns a view of the
    // input through the node (so gradients take the same path, and sum in the same order,
    // as the other outputs'); an in-place op on that view is libtorch's error, as an
    // in-place op on a stashed input would be at backward.
    //
    // An output that is a view (`(x * 2).view(..)`, `x.transpose(..)`) would be a view
    // through a custom function, and an in-place op on it after the segment (a detection
    // head writing into a slice of its output) is refused by libtorch, though the plain
    // function allows it. Such an output is detached instead: a tensor of its own (same
    // storage, same version counter) whose grad_fn is the node, which in-place ops then
    // rebase as they would the plain output. Not when autograd must keep seeing the view:
    // its base requires grad and is not an input (a view of a parameter: libtorch refuses
    // in-place ops on it in the plain function too), or another output is its base or a
    // view of the same base (an in-place op on one must be seen through the other). A view
    // of an input shares the input's version counter, so an in-place op on it is the error
    // for a modified stash, at backward, naming the segment.
    auto is_input = [&](const at::TensorBase& t) {
      for (const auto& x : in) {
        if (x.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return true;
      }
      return false;
    };
    std::vector<c10::TensorImpl*> bases(outs.size(), nullptr);
    for (size_t i = 0; i < outs.size(); ++i) {
      if (outs[i].defined() && outs[i].is_view()) bases[i] = outs[i]._base().unsafeGetTensorImpl();
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      auto& o = outs[i];
      if (!o.defined() || is_input(o)) continue;
      if (bases[i] != nullptr) {
        const at::TensorBase& base = o._base();
        bool shared = base.requires_grad() && !is_input(base);
        for (size_t j = 0; j < outs.size() && !shared; ++j) {
          if (j == i || !outs[j].defined()) continue;
          shared = outs[j].unsafeGetTensorImpl() == bases[i] || bases[j] == bases[i];
        }
        if (!shared) {
          o = o.detach();
          continue;
        }
      }
      if (o.use_count() > 1) o = o.alias();
    }

    std::vector<at::Tensor> non_differentiable;
    seg->outputs.clear();
    for (size_t i = 0; i < outs.size(); ++i) {
      const auto& o = outs[i];
      check(o.defined(), "checkpoint `", seg->name, "`: output ", i,
                  " is an undefined tensor");
      seg->outputs.push_back({o.sizes().vec(), o.scalar_type(), o.device()});
      if (!differentiable(o)) non_differentiable.push_back(o);
    }
    if (!non_differentiable.empty()) ctx->mark_non_differentiable(non_differentiable);
    ctx->save_for_backward(in);
    ctx->saved_data["segment"] = c10::IValue::make_capsule(seg);
    ctx->set_materialize_grads(false);
    return outs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto seg = c10::static_intrusive_pointer_cast<Segment>(ctx->saved_data["segment"].toCapsule());
    // The engine runs a node with grad mode on exactly when the caller asked for
    // create_graph (double backward).
    const bool create_graph = c10::GradMode::is_enabled();
    std::vector<at::Tensor> saved;
    try {
      saved = ctx->get_saved_variables();
    } catch (const c10::Error& e) {
      const std::string why = e.what_without_backtrace();
      if (why.find("backward through the graph a second time") != std::string::npos) {
        fail("checkpoint `", seg->name,
             "`: trying to backward through the graph a second time: the first backward "
             "freed the segment's saved inputs, as it frees the tensors every node saved. "
             "To backward twice, keep the graph in the first one (keep_graph = true in "
             "Tensor::run_backward, PyTorch's retain_graph=True), or run the forward "
             "again. libtorch: ", why);
      }
      fail("checkpoint `", seg->name,
           "`: an input of the segment was modified in place after the forward pass; a "
           "checkpoint keeps its inputs to recompute from them, so they must stay as they "
           "were until backward (apply the in-place op to a copy, or use the out-of-place "
           "op). libtorch: ", e.what_without_backtrace());
    }

    // loss.backward() reaches this node with an empty execution filter; run_backward /
    // autograd.grad with explicit inputs with a non-empty one ("checkpoint valid" is
    // PyTorch's name for the former).
    const bool accumulate = torch::autograd::Engine::get_default_engine().is_checkpoint_valid();
    check(!(accumulate && create_graph), "checkpoint `", seg->name,
                "`: backward with create_graph = true is supported through run_backward with "
                "explicit inputs (Tensor::run_backward(.., create_graph = true)), not through "
                "backward()");

    // The recompute's inputs. Normally the stash cut from the forward graph (detach), so
    // the recompute builds a fresh local graph and nothing flows upstream twice. For
    // double backward the input gradients must stay differentiable with respect to the
    // real inputs, so the recompute runs on differentiable aliases of the stash instead:
    // gradients stop at each alias, and the graph behind them stays connected.
    std::vector<at::Tensor> detached;
    detached.reserve(saved.size());
    for (const auto& s : saved) {
      if (create_graph && s.requires_grad()) {
        detached.push_back(s.view_as(s));
      } else {
        at::Tensor d = s.detach();
        d.set_requires_grad(s.requires_grad());
        detached.push_back(d);
      }
    }

    // The parameters' gradients are caught on their way to the accumulators and returned
    // as the node's (csrc/params.cpp): the engine then accumulates each once per backward.
    ckpt::ParamGrads param_grads(seg->params, /*pass_on=*/create_graph);
    std::vector<at::Tensor> outs;
    torch::autograd::edge_list out_edges;
    std::string grad_off_op;
    {
      RecomputeStateGuard state(*seg);
      at::AutoGradMode grad_on(true);
      ckpt_policy::Scope replay(seg->policy.get(), /*replay=*/true);
      ckpt::ParamGrads::Redirect redirect(param_grads);
      ckpt::GradOffWatch watch;
      outs = call_closure(*seg, true, detached);
      grad_off_op = watch.op();
      // An output that is a listed parameter itself leads to its capture node too.
      for (const auto& o : outs) {
        out_edges.push_back(o.defined() && o.requires_grad()
                                ? torch::autograd::impl::gradient_edge(o)
                                : torch::autograd::Edge());
      }
    }
    // The recomputed graph holds what its backward needs of the kept tensors; a second
    // recompute (keep_graph) replays them again.
    if (!torch::autograd::get_current_graph_task_keep_graph()) {
      ckpt_policy::release(seg->policy.get());
    }

    for (size_t i = 0; i < outs.size(); ++i) {
      check(outs[i].defined(), "checkpoint `", seg->name, "`: recomputed output ", i,
            " is an undefined tensor (forward produced a defined one)");
    }
    if (seg->determinism_check) {
      check(outs.size() == seg->outputs.size(), "checkpoint `", seg->name,
                  "`: recompute returned ", outs.size(), " tensors, forward returned ",
                  seg->outputs.size(),
                  "; the segment must compute the same thing both times (side effects? "
                  "data-dependent control flow?)");
      for (size_t i = 0; i < outs.size(); ++i) {
        const auto& want = seg->outputs[i];
        OutputMeta got{outs[i].sizes().vec(), outs[i].scalar_type(), outs[i].device()};
        check(got.sizes == want.sizes && got.dtype == want.dtype &&
                        got.device == want.device,
                    "checkpoint `", seg->name, "`: recomputed output ", i, " is ",
                    describe(got), " but forward produced ", describe(want),
                    "; the segment must compute the same thing both times (side effects? "
                    "data-dependent control flow?); set determinism_check = false to skip "
                    "this check");
      }
    } else {
      check(outs.size() == seg->outputs.size(), "checkpoint `", seg->name,
                  "`: recompute returned ", outs.size(), " tensors, forward returned ",
                  seg->outputs.size());
    }

    // Backpropagate from the recomputed outputs through edges, so the outputs themselves
    // can be dropped first: the recomputed graph keeps whatever its backward needs, and
    // an output it does not need (say, the sum at the end of a residual block) would
    // otherwise stay allocated through the whole backward of the segment.
    torch::autograd::edge_list roots;
    variable_list root_grads;
    for (size_t i = 0; i < outs.size(); ++i) {
      if (i < grads.size() && grads[i].defined() && outs[i].requires_grad()) {
        roots.push_back(out_edges[i]);
        root_grads.push_back(grads[i]);
      }
    }
    // A recompute that gives none of the outputs receiving a gradient a graph, though it ran
    // an op with grad off on a tensor that requires grad, had grad turned off by the
    // closure: backward would succeed with no gradient for what lies behind the segment.
    // PyTorch's reentrant checkpoint refuses any recompute with no output requiring grad
    // ("none of output has requires_grad=True"); here outputs that are constants (nothing
    // ran with grad off) keep working, as does a closure that turns grad off for some
    // outputs while another output that receives a gradient has its graph.
    if (roots.empty() && !grad_off_op.empty()) {
      for (size_t i = 0; i < outs.size() && i < grads.size(); ++i) {
        check(!grads[i].defined(), "checkpoint `", seg->name, "`: output ", i,
              " receives a gradient, but its recompute does not require grad: the recompute ran ",
              grad_off_op, " with grad mode off on a tensor that requires grad (the closure ",
              "turned grad off, e.g. tch::no_grad when ckpt::is_recomputing()), so no output ",
              "has a graph and the segment's inputs and parameters would silently get no ",
              "gradient. Do not turn grad off inside the closure (its forward runs under no_grad ",
              "already, its recompute must build the graph); for a value meant to carry no ",
              "gradient, use detach()");
      }
    }
    outs.clear();
    saved.clear();

    // Gradients: dummy, one per input, one per parameter, then the two non-tensor
    // arguments.
    const size_t n_params = seg->params.size();
    variable_list result(1 + detached.size() + n_params + 2);
    if (roots.empty()) return result;

    auto& engine = torch::autograd::Engine::get_default_engine();
    if (accumulate) {
      // loss.backward(): backpropagate through the recomputed graph. Parameters
      // accumulate their .grad here, as soon as their gradient is complete within the
      // segment (the listed ones through their capture nodes, csrc/params.cpp); their
      // accumulator nodes run once per backward, after the node returns nothing for them.
      engine.execute(roots, root_grads, /*keep_graph=*/create_graph, create_graph,
                     /*accumulate_grad=*/true);
      for (size_t i = 0; i < detached.size(); ++i) {
        if (detached[i].requires_grad()) result[1 + i] = detached[i].grad();
      }
    } else {
      // run_backward / autograd.grad with explicit inputs: nothing may accumulate into
      // .grad, so the gradients of the stash and of the listed parameters are captured.
      // A tensor the closure captured unlisted is not reachable this way: if the caller
      // asked for its gradient (its accumulator is in this backward's outputs), that is an
      // error rather than a gradient missing the segment's part.
      const std::string unseen = ckpt::requested_but_unseen(roots, detached);
      check(unseen.empty(), "checkpoint `", seg->name, "`: backward with explicit inputs asked ",
            "for the gradient of a tensor (", unseen, ") that the segment's closure captured ",
            "without listing it, so the checkpoint cannot return that gradient. Capture modules ",
            "through ShallowClone (#[checkpointed], model!, checkpoint_sequential do), list the ",
            "tensors with CheckpointOptions::parameters, pass the tensor as an input of the ",
            "segment, or use backward()");
      torch::autograd::edge_list wanted;
      std::vector<size_t> index;
      for (size_t i = 0; i < detached.size(); ++i) {
        if (detached[i].requires_grad()) {
          wanted.push_back(torch::autograd::impl::gradient_edge(detached[i]));
          index.push_back(1 + i);
        }
      }
      auto capture_edges = param_grads.edges();
      for (size_t j = 0; j < n_params; ++j) {
        wanted.push_back(capture_edges[j]);
        index.push_back(1 + detached.size() + j);
      }
      if (!wanted.empty()) {
        auto gs = engine.execute(roots, root_grads, /*keep_graph=*/create_graph, create_graph,
                                 /*accumulate_grad=*/false, wanted);
        for (size_t k = 0; k < index.size(); ++k) result[index[k]] = gs[k];
      }
    }
    return result;
  }
};


}  // namespace

// ---------------------------------------------------------------------------------
// C API used by src/ffi.rs

extern "C" {

int32_t ckpt_apply(const ckpt_segment* spec, const ckpt_ctx* ctx) {
  c10::intrusive_ptr<Segment> seg;
  const int32_t made = ckpt::guarded(ctx->error, [&] {
    seg = c10::make_intrusive<Segment>(spec->callbacks);
  });
  if (made != 0) {
    spec->callbacks.drop(spec->callbacks.user);
    return made;
  }
  return ckpt::guarded(ctx->error, [&] {
    install_counting_allocator();
    seg->name.assign(spec->name, spec->name_len);
    seg->preserve_rng_state = spec->preserve_rng_state != 0;
    seg->determinism_check = spec->determinism_check != 0;
    std::vector<at::Tensor> in;
    in.reserve(spec->n_inputs);
    for (size_t i = 0; i < spec->n_inputs; ++i) {
      check(spec->inputs[i]->defined(), "checkpoint `", seg->name, "`: input ", i,
            " is an undefined tensor");
      in.push_back(*spec->inputs[i]);
    }
    std::vector<at::Tensor> listed;
    listed.reserve(spec->n_params);
    for (size_t i = 0; i < spec->n_params; ++i) listed.push_back(*spec->params[i]);
    seg->params = ckpt::node_params(listed);
    std::vector<at::Tensor> forward_outs = run_forward(*seg, in);
    std::vector<at::Tensor> params = seg->params;
    at::Tensor dummy = at::empty({0}, at::TensorOptions().dtype(at::kFloat)).requires_grad_(true);
    variable_list outs = CheckpointFunction::apply(dummy, at::TensorList(in), at::TensorList(params),
                                                   std::move(seg), &forward_outs);
    for (const auto& o : outs) ctx->push(ctx->tensors, new at::Tensor(o));
  });
}

int32_t ckpt_grad_enabled() { return c10::GradMode::is_enabled() ? 1 : 0; }

int64_t ckpt_live_segments() { return g_live_segments.load(); }

}  // extern "C"

// Parameters that a segment captures (module state reached through `ShallowClone`, listed
// by the Rust side) are inputs of the checkpoint node, so libtorch's engine sees them:
// `run_backward` with a parameter among its inputs gets its gradient, and the parameter's
// gradient accumulator node runs once per backward, after every segment that used it
// (DDP's Reducer hooks there and reads the complete `.grad`), as without checkpointing.
//
// The recompute records its graph with each listed parameter's accumulator redirected to a
// capture node (the autograd meta's `grad_accumulator_`, which every op consults when it
// records an edge to a leaf), and puts the real one back as soon as the recompute's forward
// is over. What the capture node does with the gradient depends on the backward:
// - `backward()` (accumulating): it accumulates the gradient into `.grad` at once, through
//   the real accumulator's own code (its tensor hooks first), so that no gradient waits
//   for the end of the segment's backward; the node then returns no gradient for the
//   parameter, and the accumulator node runs once per backward with nothing to add.
//   Holding the segment's parameter gradients until the node returns, to add them once,
//   would cost up to a segment's parameter bytes at its backward (measured: +19 MB on a
//   26 MB ResNet-18 step).
// - `run_backward` with explicit inputs (nothing may accumulate): the engine captures the
//   capture node's input as a wanted output without running it, and the node returns it
//   as its parameter's gradient.
// - double backward: the capture node leads on to the real accumulator (see CaptureGrad).
//
// The node takes only the parameters its forward run read: every op of that run is seen
// through a thread-local RecordFunction callback (PyTorch's profiler hook) that marks the
// listed parameters among the op's inputs. An edge to a parameter the segment does not use
// would hold its accumulator node back until the segment's backward.
//
// The recompute's ops are watched the same way (`GradOffWatch`) for one mistake: an op run
// with grad mode off on a tensor that requires grad, which is the closure turning grad off
// in its recompute. The node's backward refuses a recompute that, so made, gives none of
// the outputs that receive a gradient a graph (csrc/ckpt.cpp).

#ifndef NDEBUG
#define NDEBUG
#endif

#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/variable.h>

#include "extra.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace ckpt {

namespace {

using torch::autograd::Edge;
using torch::autograd::Node;
using torch::autograd::variable_list;

// Where the recompute's backward delivers the gradient of one parameter.
//
// Without an edge (a backward that accumulates runs it) it hands the gradient to the
// parameter's real accumulator: the variable's tensor pre-hooks, then the accumulator's
// own `apply` through `operator()` (accumulation into `.grad` and its post-accumulate
// hook; the node's post hooks, such as DDP's, run when the engine runs the accumulator
// node itself, once per backward). In a backward with explicit inputs it is not run:
// its input is captured.
// With an edge to the accumulator (double backward), it is a pass-through: the backward
// of the recompute captures its input without running it, and a later backward through
// the recomputed graph (the first-order gradients' graph leads back into the recomputed
// forward) passes through it to the parameter.
struct CaptureGrad : Node {
  // The sequence number of `AccumulateGrad` (the largest): the engine runs the node as soon
  // as its gradient is complete, before the rest of the backward, so the gradient does not
  // wait in a buffer.
  CaptureGrad(const at::Tensor& param, c10::intrusive_ptr<Node> accumulator, bool pass_on)
      : Node(UINT64_MAX, pass_on ? torch::autograd::edge_list{Edge(accumulator, 0)}
                                 : torch::autograd::edge_list{}),
        accumulator_(std::move(accumulator)) {
    add_input_metadata(param);
  }

  variable_list apply(variable_list&& grads) override {
    if (num_outputs() > 0) return std::move(grads);
    if (grads.empty() || !grads[0].defined() || !accumulator_) return {};
    for (const auto& hook : accumulator_->tensor_pre_hooks()) grads = (*hook)(grads);
    (*accumulator_)(std::move(grads));
    return {};
  }

  std::string name() const override { return "ckpt::CaptureGrad"; }

 private:
  c10::intrusive_ptr<Node> accumulator_;
};

// The trackers of the forward runs under way on this thread (nested segments: each sees
// the ops of the runs inside it), and the callback that feeds them while there are any.
thread_local std::vector<ParamUsage*> t_usage;
thread_local at::CallbackHandle t_usage_callback = 0;

void mark_tensor(const at::Tensor& t) {
  if (!t.defined()) return;
  for (ParamUsage* u : t_usage) u->mark(t.unsafeGetTensorImpl());
}

void mark_value(const c10::IValue& v) {
  if (v.isTensor()) {
    mark_tensor(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorVector()) mark_tensor(t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isTensor()) mark_tensor(e.toTensor());
    }
  }
}

std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction& fn) {
  for (const c10::IValue& v : fn.inputs()) mark_value(v);
  return nullptr;
}

// The recompute watches under way on this thread, innermost last; null for a pause (a
// nested segment's forward run), and the callback that feeds the innermost while there is
// one.
thread_local std::vector<GradOffWatch*> t_watch;
thread_local at::CallbackHandle t_watch_callback = 0;

bool requires_grad(const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    return t.defined() && t.requires_grad();
  }
  if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorVector()) {
      if (t.defined() && t.requires_grad()) return true;
    }
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isTensor() && e.toTensor().defined() && e.toTensor().requires_grad()) return true;
    }
  }
  return false;
}

std::unique_ptr<at::ObserverContext> on_recompute_op(const at::RecordFunction& fn) {
  if (c10::GradMode::is_enabled() || t_watch.empty()) return nullptr;
  GradOffWatch* w = t_watch.back();
  if (w == nullptr || !w->op().empty()) return nullptr;
  for (const c10::IValue& v : fn.inputs()) {
    if (requires_grad(v)) {
      w->note(fn.name());
      break;
    }
  }
  return nullptr;
}

void push_watch(GradOffWatch* w) {
  if (t_watch.empty()) {
    t_watch_callback = at::addThreadLocalCallback(at::RecordFunctionCallback(on_recompute_op)
                                                      .needsInputs(true)
                                                      .scopes({at::RecordScope::FUNCTION}));
  }
  t_watch.push_back(w);
}

void pop_watch() {
  t_watch.pop_back();
  if (t_watch.empty()) {
    at::removeCallback(t_watch_callback);
    t_watch_callback = 0;
  }
}

}  // namespace

GradOffWatch::GradOffWatch() { push_watch(this); }

GradOffWatch::~GradOffWatch() { pop_watch(); }

void GradOffWatch::note(const char* op) { op_ = (op != nullptr && *op != '\0') ? op : "an op"; }

// A pause outside every watch costs nothing: no callback is installed for it.
GradOffWatch::Pause::Pause() {
  if (t_watch.empty()) return;
  push_watch(nullptr);
  active_ = true;
}

GradOffWatch::Pause::~Pause() {
  if (active_) pop_watch();
}

ParamUsage::ParamUsage(const std::vector<at::Tensor>& params) : params_(params) {
  if (params_.empty()) return;
  used_.assign(params_.size(), false);
  for (size_t i = 0; i < params_.size(); ++i) index_.emplace(params_[i].unsafeGetTensorImpl(), i);
  if (t_usage.empty()) {
    t_usage_callback = at::addThreadLocalCallback(
        at::RecordFunctionCallback(on_op_start).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
  }
  t_usage.push_back(this);
  active_ = true;
}

ParamUsage::~ParamUsage() {
  if (!active_) return;
  t_usage.erase(std::find(t_usage.begin(), t_usage.end(), this));
  if (t_usage.empty()) {
    at::removeCallback(t_usage_callback);
    t_usage_callback = 0;
  }
}

void ParamUsage::mark(const c10::TensorImpl* impl) {
  auto it = index_.find(impl);
  if (it != index_.end()) used_[it->second] = true;
}

std::vector<at::Tensor> ParamUsage::used() const {
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (used_[i]) out.push_back(params_[i]);
  }
  return out;
}

std::vector<at::Tensor> node_params(const std::vector<at::Tensor>& listed) {
  std::vector<at::Tensor> out;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& p : listed) {
    if (!p.defined() || !p.requires_grad() || !p.is_leaf()) continue;
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
    out.push_back(p);
  }
  return out;
}

ParamGrads::ParamGrads(const std::vector<at::Tensor>& params, bool pass_on) : params_(params) {
  capture_.reserve(params.size());
  for (const auto& p : params) {
    auto accumulator = torch::autograd::impl::grad_accumulator(p);
    capture_.push_back(c10::make_intrusive<CaptureGrad>(p, std::move(accumulator), pass_on));
  }
}

ParamGrads::Redirect::Redirect(const ParamGrads& g) {
  saved_.reserve(g.params_.size());
  try {
    for (size_t i = 0; i < g.params_.size(); ++i) {
      const at::Tensor& p = g.params_[i];
      auto* meta = torch::autograd::impl::get_autograd_meta(p);
      if (meta == nullptr) continue;  // not possible for a leaf that requires grad
      std::lock_guard<std::mutex> lock(meta->mutex_);
      saved_.emplace_back(p, meta->grad_accumulator_);
      meta->grad_accumulator_ = c10::weak_intrusive_ptr<Node>(g.capture_[i]);
    }
  } catch (...) {
    restore();
    throw;
  }
}

void ParamGrads::Redirect::restore() noexcept {
  for (auto& [p, acc] : saved_) {
    auto* meta = torch::autograd::impl::get_autograd_meta(p);
    std::lock_guard<std::mutex> lock(meta->mutex_);
    meta->grad_accumulator_ = std::move(acc);
  }
  saved_.clear();
}

ParamGrads::Redirect::~Redirect() { restore(); }

torch::autograd::edge_list ParamGrads::edges() const {
  torch::autograd::edge_list out;
  out.reserve(capture_.size());
  for (const auto& c : capture_) out.emplace_back(c, 0);
  return out;
}

std::string requested_but_unseen(const torch::autograd::edge_list& roots,
                                 const std::vector<at::Tensor>& stash) {
  const auto* exec_info = torch::autograd::get_current_graph_task_exec_info();
  if (exec_info == nullptr || exec_info->empty()) return {};
  // The recomputed graph ends at the stash (leaves, or for double backward aliases whose
  // graph continues into the caller's): the walk stops there.
  std::unordered_set<Node*> visited;
  for (const auto& t : stash) {
    if (t.requires_grad()) visited.insert(torch::autograd::impl::gradient_edge(t).function.get());
  }
  std::vector<Node*> stack;
  for (const auto& e : roots) {
    if (e.function && visited.insert(e.function.get()).second) stack.push_back(e.function.get());
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (dynamic_cast<CaptureGrad*>(n) != nullptr) continue;  // a listed parameter
    if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(n)) {
      auto it = exec_info->find(n);
      if (it != exec_info->end() && it->second.captures_ && !it->second.captures_->empty()) {
        return c10::str(acc->variable.sizes(), " ", acc->variable.scalar_type());
      }
    }
    for (const auto& e : n->next_edges()) {
      if (e.function && visited.insert(e.function.get()).second) stack.push_back(e.function.get());
    }
  }
  return {};
}

}  // namespace ckpt

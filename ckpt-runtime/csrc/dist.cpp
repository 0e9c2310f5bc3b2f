// The C++ half of `ckpt::dist`: PyTorch's own data-parallel engine (c10d) bound for
// Rust. TCPStore / PrefixStore for rendezvous, ProcessGroupGloo for CPU collectives,
// and the DDP `c10d::Reducer` (bucketed gradient all-reduce overlapped with backward).
//
// Rules of this file (as in ckpt.cpp; the boundary's types and helpers are csrc/ffi.h):
// - every fallible `extern "C"` entry point runs in `ckpt::guarded`, which reports every
//   C++ exception's message through the caller's error slot and returns non-zero;
//   nothing throws across the boundary;
// - handles are heap objects owned by Rust and freed by the matching `_free` function.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef USE_C10D_NCCL
// Only with the `nccl` cargo feature: needs the CUDA runtime, crt, cccl and NCCL headers.
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/logger.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "ffi.h"

typedef ckpt_tensor tensor;

using ckpt::guarded;

namespace {

template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  throw std::runtime_error(c10::str(args...));
}

struct Store {
  c10::intrusive_ptr<c10d::Store> store;
};

struct Group {
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  std::chrono::milliseconds timeout;
};

// The local address of the route to `host`: the interface Gloo should bind to so that
// the master (and, on one machine, every rank) can reach it. A UDP `connect` sends
// nothing; it only asks the kernel for the route.
std::string local_address_towards(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) fail("cannot resolve master address `", host, "`: ", gai_strerror(rc));
  std::string found;
  std::string last_error;
  for (addrinfo* ai = res; ai != nullptr && found.empty(); ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      sockaddr_storage local{};
      socklen_t len = sizeof(local);
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
        char buf[INET6_ADDRSTRLEN] = {0};
        const void* addr = local.ss_family == AF_INET
                               ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                               : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
        if (inet_ntop(local.ss_family, addr, buf, sizeof(buf)) != nullptr) found = buf;
      }
    } else {
      last_error = std::strerror(errno);
    }
    close(fd);
  }
  freeaddrinfo(res);
  if (found.empty()) fail("no route to master address `", host, "`: ", last_error);
  return found;
}

c10d::ReduceOp reduce_op(int32_t op) {
  switch (op) {
    case 0:
    case 1:  // average: Gloo has no AVG; sum, then divide (as torch.distributed does)
      return c10d::ReduceOp::SUM;
    case 2:
      return c10d::ReduceOp::MAX;
    case 3:
      return c10d::ReduceOp::MIN;
    default:
      fail("unknown reduce op ", op);
  }
}

void wait(const c10::intrusive_ptr<c10d::Work>& work, const Group& g) {
  if (!work->wait(g.timeout)) fail("collective did not complete within ", g.timeout.count(), " ms");
}

// ---------------------------------------------------------------------------------
// DistributedDataParallel: the Reducer and what Python's DDP keeps around it.

struct Ddp {
  std::shared_ptr<c10d::Reducer> reducer;
  // The Reducer's logger, as Python DDP gives it one: the Reducer holds it weakly and
  // calls it unchecked when `find_unused_parameters` sees the set of unused
  // parameters change between iterations (`search_unused_parameters` ->
  // `log_if_graph_static`), a null dereference without it.
  std::shared_ptr<c10d::Logger> logger;
  bool static_graph = false;
  bool find_unused = false;
  // Whether the end-of-backward `delay_all_reduce` of the first static-graph iteration
  // has been queued (Python DDP: `_static_graph_delay_allreduce_enqueued`).
  bool delay_enqueued = false;
  std::mutex mutex;
  // With `record_launches`: gradient-accumulation hooks fired in the current backward
  // (our own post hooks, registered after the Reducer's), and per bucket all-reduce
  // launched: (bucket index, hooks fired when it launched).
  std::shared_ptr<std::atomic<int64_t>> hooks_fired = std::make_shared<std::atomic<int64_t>>(0);
  std::shared_ptr<std::mutex> launch_mutex = std::make_shared<std::mutex>();
  std::shared_ptr<std::vector<std::pair<int64_t, int64_t>>> launches =
      std::make_shared<std::vector<std::pair<int64_t, int64_t>>>();
  std::vector<std::pair<uintptr_t, c10::intrusive_ptr<torch::autograd::Node>>> own_hooks;

  ~Ddp() {
    for (auto& [key, acc] : own_hooks) acc->del_post_hook(key);
  }
};

// The Reducer's default reduction (average: divide, then sum-all-reduce the bucket),
// recording each launch. Only installed when asked for, to observe that buckets are
// reduced while backward is still running.
struct RecordingHook : public c10d::CommHookInterface {
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  std::shared_ptr<std::atomic<int64_t>> hooks_fired;
  std::shared_ptr<std::mutex> mutex;
  std::shared_ptr<std::vector<std::pair<int64_t, int64_t>>> launches;

  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    {
      std::lock_guard<std::mutex> lock(*mutex);
      launches->emplace_back(static_cast<int64_t>(bucket.getIndex()), hooks_fired->load());
    }
    at::Tensor& t = bucket.getBufferRef();
    t.div_(pg->getSize());
    std::vector<at::Tensor> ts{t};
    return pg->allreduce(ts)->getFuture();
  }
  at::Tensor parseHookResult(const c10::IValue& result) override {
    return c10d::detail::parseCppCommHookResult(result);
  }
};

// Python DDP's `_DDPSink`: an identity node on the forward's outputs. Its backward runs
// first in `loss.backward()`, on the engine's outermost graph task, and there queues the
// static graph's first-iteration `delay_all_reduce` as an end-of-backward callback.
// Queued from anywhere else (a hook inside a checkpoint's recompute runs in a nested,
// reentrant graph task) the callback would run when that nested task ends, too early.
struct DdpSink : public torch::autograd::Node {
  std::shared_ptr<Ddp> ddp;
  explicit DdpSink(std::shared_ptr<Ddp> d) : ddp(std::move(d)) {}
  std::string name() const override { return "ckpt::DdpSink"; }
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(ddp->mutex);
    if (ddp->static_graph && !ddp->delay_enqueued) {
      std::shared_ptr<c10d::Reducer> reducer = ddp->reducer;
      torch::autograd::Engine::get_default_engine().queue_callback(
          [reducer] { reducer->delay_all_reduce(); });
      ddp->delay_enqueued = true;
    }
    return std::move(grads);
  }
};

// Whether a forward reduces in its backward. Under static graph, the first backward
// teaches the Reducer how many times each parameter's hook fires; a `no_sync` backward
// before it would be counted too (the Reducer counts every backward until its first
// finalize), doubling the counts, after which no parameter ever becomes ready. So until
// that first reduction is queued, `no_sync` forwards are synchronized: averaging is
// linear and the reduced partial gradient is the same on every rank, so the
// accumulated result is the same as with local accumulation, at the cost of one more
// all-reduce in the first step.
bool effective_sync(Ddp& d, bool sync) {
  std::lock_guard<std::mutex> lock(d.mutex);
  return sync || (d.static_graph && !d.delay_enqueued);
}

}  // namespace

extern "C" {

// ---------------------------------------------------------------------------------
// Stores

// A TCPStore client (or server, when `is_server`), optionally under `prefix`.
int32_t ckpt_dist_store_new(const char* host, size_t host_len, uint16_t port, int32_t world,
                            int32_t is_server, int64_t timeout_ms, const char* prefix,
                            size_t prefix_len, void** out, void* err, ckpt_msg_fn set_err) {
  return guarded(err, set_err, [&] {
    c10d::TCPStoreOptions opts;
    opts.port = port;
    opts.isServer = is_server != 0;
    opts.numWorkers = static_cast<size_t>(world);
    opts.waitWorkers = false;
    opts.timeout = std::chrono::milliseconds(timeout_ms);
    opts.multiTenant = false;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(std::string(host, host_len), opts);
    c10::intrusive_ptr<c10d::Store> store = tcp;
    if (prefix_len > 0) {
      store = c10::make_intrusive<c10d::PrefixStore>(std::string(prefix, prefix_len), store);
    }
    *out = new Store{store};
  });
}

void ckpt_dist_store_free(void* store) { delete static_cast<Store*>(store); }

int32_t ckpt_dist_store_set(void* store, const char* key, size_t key_len, const uint8_t* value,
                            size_t value_len, void* err, ckpt_msg_fn set_err) {
  return guarded(err, set_err, [&] {
    static_cast<Store*>(store)->store->set(std::string(key, key_len),
                                           std::vector<uint8_t>(value, value + value_len));
  });
}

// Waits for `key` (up to the store's timeout) and hands its value to `push`.
int32_t ckpt_dist_store_get(void* store, const char* key, size_t key_len, void* ctx,
                            ckpt_msg_fn push, void* err, ckpt_msg_fn set_err) {
  return guarded(err, set_err, [&] {
    auto v = static_cast<Store*>(store)->store->get(std::string(key, key_len));
    push(ctx, reinterpret_cast<const char*>(v.data()), v.size());
  });
}

// ---------------------------------------------------------------------------------
// Process groups

// A Gloo process group. The transport binds to interface `ifname` when given (the
// user's GLOO_SOCKET_IFNAME), else to the local address of the route to `master`.
int32_t ckpt_dist_pg_new_gloo(void* store, int32_t rank, int32_t world, const char* ifname,
                              size_t ifname_len, const char* master, size_t master_len,
                              uint16_t master_port, int64_t timeout_ms, int32_t threads,
                              void** out, void* err, ckpt_msg_fn set_err) {
  return guarded(err, set_err, [&] {
    auto s = static_cast<Store*>(store)->store;
    auto timeout = std::chrono::milliseconds(timeout_ms);
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    if (ifname_len > 0) {
      // GLOO_SOCKET_IFNAME: one interface or several, comma-separated (as in Python).
      const std::string names(ifname, ifname_len);
      size_t start = 0;
      while (start <= names.size()) {
        size_t end = names.find(',', start);
        if (end == std::string::npos) end = names.size();
        if (end > start) {
          opts->devices.push_back(
              c10d::ProcessGroupGloo::createDeviceForInterface(names.substr(start, end - start)));
        }
        start = end + 1;
      }
      if (opts->devices.empty()) fail("GLOO_SOCKET_IFNAME names no interface");
    } else {
      const auto local = local_address_towards(std::string(master, master_len), master_port);
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(local));
    }
    if (threads > 0) opts->threads = threads;
    auto backend = c10::make_intrusive<c10d::ProcessGroupGloo>(s, rank, world, opts);
    auto pg = c10::make_intrusive<c10d::ProcessGroup>(s, rank, world);
    pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
    pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, backend);
    *out = new Group{pg, timeout};
  });
}

// Whether this build has the NCCL backend (the `nccl` cargo feature).
int32_t ckpt_dist_has_nccl() {
#ifdef USE_C10D_NCCL
  return 1;
#else
  return 0;
#endif
}

// An NCCL process group on CUDA tensors (Python's `init_process_group("nccl")`): the
// caller has checked that CUDA is available. Without the `nccl` feature, an error.
int32_t ckpt_dist_pg_new_nccl(void* store, int32_t rank, int32_t world, int64_t timeout_ms,
                              void** out, void* err, ckpt_msg_fn set_err) {
  return guarded(err, set_err, [&] {
#ifdef USE_C10D_NCCL
    auto s = static_cast<Store*>(store)->store;
    auto timeout = std::chrono::milliseconds(timeout_ms);
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    auto backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(s, rank, world, opts);
    auto pg = c10::make_intrusive<c10d::ProcessGroup>(s, rank, world);
    pg->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
    pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, backend);
    *out = new Group{pg, timeout};
#else
    (void)store, (void)rank, (void)world, (void)timeout_ms, (void)out;
    fail("the NCCL backend is not built in: build ckpt with the `nccl` feature");
#endif
  });
}

void ckpt_dist_pg_free(void* group) { delete static_cast<Group*>(group); }

// In place on `t`. op: 0 sum, 1 average, 2 max, 3 min.
int32_t ckpt_dist_all_reduce(void* group, tensor t, int32_t op, void* err, ckpt_msg_fn set_err) {
  return guarded(err, set_err, [&] {
    auto& g = *static_cast<Group*>(group);
    std::vector<at::Tensor> ts{*t};
    c10d::AllreduceOptions o;
    o.reduceOp = reduce_op(op);
    o.timeout = g.timeout;
    wait(g.pg->allreduce(ts, o), g);
    if (op == 1) {
      at::NoGradGuard no_grad;
      t->div_(g.pg->getSize());
    }
  });
}

int32_t ckpt_dist_broadcast(void* group, tensor t, int32_t root, void* err, ckpt_msg_fn set_err) {
  return guarded(err, set_err, [&] {
    auto& g = *static_cast<Group*>(group);
    if (root < 0 || root >= g.pg->getSize()) fail("broadcast root ", root, " is not a rank of a group of ", g.pg->getSize());
    std::vector<at::Tensor> ts{*t};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.timeout = g.timeout;
    wait(g.pg->broadcast(ts, o), g);
  });
}

// `outs[r]` receives rank r's `input`; `n_outs` must be the world size.
int32_t ckpt_dist_all_gather(void* group, tensor* outs, size_t n_outs, tensor input, void* err,
                             ckpt_msg_fn set_err) {
  return guarded(err, set_err, [&] {
    auto& g = *static_cast<Group*>(group);
    std::vector<std::vector<at::Tensor>> o(1);
    for (size_t i = 0; i < n_outs; ++i) o[0].push_back(*outs[i]);
    std::vector<at::Tensor> in{*input};
    c10d::AllgatherOptions opts;
    opts.timeout = g.timeout;
    wait(g.pg->allgather(o, in, opts), g);
  });
}

// `output` receives the reduction over ranks of every rank's `inputs[rank]`.
int32_t ckpt_dist_reduce_scatter(void* group, tensor output, tensor* inputs, size_t n_inputs,
                                 int32_t op, void* err, ckpt_msg_fn set_err) {
  return guarded(err, set_err, [&] {
    auto& g = *static_cast<Group*>(group);
    std::vector<at::Tensor> out{*output};
    std::vector<std::vector<at::Tensor>> in(1);
    for (size_t i = 0; i < n_inputs; ++i) in[0].push_back(*inputs[i]);
    c10d::ReduceScatterOptions o;
    o.reduceOp = reduce_op(op);
    o.timeout = g.timeout;
    wait(g.pg->reduce_scatter(out, in, o), g);
    if (op == 1) {
      at::NoGradGuard no_grad;
      output->div_(g.pg->getSize());
    }
  });
}

int32_t ckpt_dist_barrier(void* group, void* err, ckpt_msg_fn set_err) {
  return guarded(err, set_err, [&] {
    auto& g = *static_cast<Group*>(group);
    c10d::BarrierOptions o;
    o.timeout = g.timeout;
    wait(g.pg->barrier(o), g);
  });
}

// Copies rank `root`'s values of the `n` tensors into every rank's, flattened into
// buffers of up to `buffer_bytes` (c10d's `broadcast_coalesced`, as Python DDP syncs
// module states).
int32_t ckpt_dist_broadcast_coalesced(void* group, tensor* ts, size_t n, int64_t buffer_bytes,
                                      int32_t root, void* err, ckpt_msg_fn set_err) {
  return guarded(err, set_err, [&] {
    auto& g = *static_cast<Group*>(group);
    if (root < 0 || root >= g.pg->getSize()) fail("broadcast root ", root, " is not a rank of a group of ", g.pg->getSize());
    std::vector<at::Tensor> states;
    for (size_t i = 0; i < n; ++i) states.push_back(ts[i]->detach());
    at::NoGradGuard no_grad;
    c10d::broadcast_coalesced(g.pg, states, static_cast<size_t>(buffer_bytes), root);
  });
}

// ---------------------------------------------------------------------------------
// DistributedDataParallel

// Checks that every rank has the same parameters (count, shapes, dtypes) as rank 0,
// broadcasts rank 0's values (and the `n_buffers` buffers after them) into every rank,
// and builds the Reducer over the first `n_params` tensors with PyTorch's default
// buckets: `compute_bucket_assignment_by_size` with limits [first_bucket_bytes,
// bucket_bytes], buckets reversed (parameters defined first are used first in forward,
// so their gradients come last in backward).
int32_t ckpt_ddp_new(void* group, tensor* params, size_t n_params, tensor* buffers,
                     size_t n_buffers, int64_t bucket_bytes, int64_t first_bucket_bytes,
                     int32_t find_unused, int32_t static_graph, int32_t record_launches,
                     void** out, void* err,
                     ckpt_msg_fn set_err) {
  return guarded(err, set_err, [&] {
    auto& g = *static_cast<Group*>(group);
    if (n_params == 0) fail("DistributedDataParallel needs at least one trainable parameter");
    std::vector<at::Tensor> ps;
    for (size_t i = 0; i < n_params; ++i) {
      if (!params[i]->requires_grad()) fail("parameter ", i, " does not require grad");
      ps.push_back(*params[i]);
    }
    c10d::verify_params_across_processes(g.pg, ps, std::nullopt);
    {
      std::vector<at::Tensor> states;
      for (auto& p : ps) states.push_back(p.detach());
      for (size_t i = 0; i < n_buffers; ++i) states.push_back(buffers[i]->detach());
      at::NoGradGuard no_grad;
      // 250 MiB: Python DDP's `_DEFAULT_BUCKET_CAP_MB`-independent broadcast size.
      c10d::broadcast_coalesced(g.pg, states, 250 * 1024 * 1024, 0);
    }
    std::vector<size_t> limits{static_cast<size_t>(first_bucket_bytes), static_cast<size_t>(bucket_bytes)};
    std::vector<bool> sparse(ps.size(), false);
    auto [indices, per_bucket] = c10d::compute_bucket_assignment_by_size(ps, limits, sparse);
    (void)per_bucket;
    std::reverse(indices.begin(), indices.end());
    auto d = std::make_shared<Ddp>();
    d->static_graph = static_graph != 0;
    d->find_unused = find_unused != 0;
    d->reducer = std::make_shared<c10d::Reducer>(
        ps, indices, g.pg, sparse, bucket_bytes, find_unused != 0,
        /*gradient_as_bucket_view=*/false, std::unordered_map<size_t, std::string>{},
        first_bucket_bytes, /*skip_all_reduce_unused_params=*/false,
        /*use_python_reducer=*/false, std::vector<int64_t>{});
    d->logger = std::make_shared<c10d::Logger>(d->reducer);
    d->reducer->set_logger(d->logger);
    if (d->static_graph) d->reducer->set_static_graph();
    if (record_launches) {
      auto hook = std::make_unique<RecordingHook>();
      hook->pg = g.pg;
      hook->hooks_fired = d->hooks_fired;
      hook->mutex = d->launch_mutex;
      hook->launches = d->launches;
      d->reducer->register_comm_hook(std::move(hook));
      for (auto& p : ps) {
        auto acc = torch::autograd::impl::grad_accumulator(p);
        auto counter = d->hooks_fired;
        auto key = acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [counter](const torch::autograd::variable_list& outputs,
                      const torch::autograd::variable_list& /*inputs*/) {
              counter->fetch_add(1);
              return outputs;
            }));
        d->own_hooks.emplace_back(key, acc);
      }
    }
    *out = new std::shared_ptr<Ddp>(d);
  });
}

void ckpt_ddp_free(void* ddp) { delete static_cast<std::shared_ptr<Ddp>*>(ddp); }

// Python DDP `_pre_forward`: `sync` is false inside `no_sync()`.
int32_t ckpt_ddp_pre_forward(void* ddp, int32_t sync, void* err, ckpt_msg_fn set_err) {
  return guarded(err, set_err, [&] {
    auto& d = **static_cast<std::shared_ptr<Ddp>*>(ddp);
    if (!at::GradMode::is_enabled()) return;
    if (effective_sync(d, sync)) d.reducer->prepare_for_forward();
    d.reducer->rebuild_buckets();
  });
}

// Python DDP `_post_forward`: tells the Reducer a backward is coming (when `sync`), and
// passes the outputs through the sink where needed; the (possibly new) outputs are
// pushed to `push` in order.
int32_t ckpt_ddp_post_forward(void* ddp, tensor* outputs, size_t n, int32_t sync, void* ctx,
                              ckpt_push_fn push, void* err, ckpt_msg_fn set_err) {
  return guarded(err, set_err, [&] {
    auto d = *static_cast<std::shared_ptr<Ddp>*>(ddp);
    std::vector<at::Tensor> outs;
    for (size_t i = 0; i < n; ++i) outs.push_back(*outputs[i]);
    const bool grad = at::GradMode::is_enabled();
    sync = effective_sync(*d, sync);
    if (grad && sync) {
      d->hooks_fired->store(0);
      {
        std::lock_guard<std::mutex> lock(*d->launch_mutex);
        d->launches->clear();
      }
      if (d->find_unused && !d->static_graph) {
        d->reducer->prepare_for_backward(outs);
      } else {
        d->reducer->prepare_for_backward({});
      }
    }
    bool sink = false;
    {
      std::lock_guard<std::mutex> lock(d->mutex);
      sink = grad && sync && ((d->find_unused && !d->static_graph) || (d->static_graph && !d->delay_enqueued));
    }
    if (sink) {
      std::vector<at::Tensor> through;
      std::vector<size_t> where;
      for (size_t i = 0; i < outs.size(); ++i) {
        if (outs[i].defined() && outs[i].requires_grad()) {
          through.push_back(outs[i]);
          where.push_back(i);
        }
      }
      if (!through.empty()) {
        auto node = c10::make_intrusive<DdpSink>(d);
        node->set_next_edges(torch::autograd::collect_next_edges(through));
        for (size_t k = 0; k < through.size(); ++k) {
          at::Tensor alias = through[k].detach();
          torch::autograd::create_gradient_edge(alias, node);
          outs[where[k]] = alias;
        }
      }
    }
    for (auto& o : outs) push(ctx, new at::Tensor(o));
  });
}

// The buckets in reduction order, as "index:numel;" each, then "|", then the launches
// recorded in the last backward as "bucket@hooks_fired;" each, then "|" and the hooks
// fired in it.
int32_t ckpt_ddp_describe(void* ddp, void* ctx, ckpt_msg_fn push, void* err, ckpt_msg_fn set_err) {
  return guarded(err, set_err, [&] {
    auto& d = **static_cast<std::shared_ptr<Ddp>*>(ddp);
    std::string desc;
    for (auto& b : d.reducer->get_grad_buckets(/*return_zero_tensors=*/false)) {
      desc += std::to_string(b.getIndex()) + ":" + std::to_string(b.getBuffer().numel()) + ";";
    }
    desc += "|";
    {
      std::lock_guard<std::mutex> lock(*d.launch_mutex);
      for (auto& [b, fired] : *d.launches) desc += std::to_string(b) + "@" + std::to_string(fired) + ";";
    }
    desc += "|" + std::to_string(d.hooks_fired->load());
    push(ctx, desc.data(), desc.size());
  });
}

}  // extern "C"

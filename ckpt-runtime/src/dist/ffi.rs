//! The C boundary of `ckpt::dist`: declarations of `csrc/dist.cpp` and safe wrappers
//! over them, on the types and helpers of `ffi.rs` (`csrc/ffi.h`). Every C++ entry point
//! reports its exceptions through the error slot of [`call`] (`ckpt::guarded` in C++); the
//! callbacks it calls run in `ffi::guarded`; nothing unwinds across the boundary.

use std::ffi::c_void;

use tch::Tensor;
use torch_sys::C_tensor;

use crate::CkptError;
use crate::ffi::{MsgFn, PushFn, guarded, push_tensor};

unsafe extern "C" {
    #[allow(clippy::too_many_arguments)]
    fn ckpt_dist_store_new(
        host: *const u8,
        host_len: usize,
        port: u16,
        world: i32,
        is_server: i32,
        timeout_ms: i64,
        prefix: *const u8,
        prefix_len: usize,
        out: *mut *mut c_void,
        err: *mut c_void,
        set_err: MsgFn,
    ) -> i32;
    fn ckpt_dist_store_free(store: *mut c_void);
    fn ckpt_dist_store_set(
        store: *mut c_void,
        key: *const u8,
        key_len: usize,
        value: *const u8,
        value_len: usize,
        err: *mut c_void,
        set_err: MsgFn,
    ) -> i32;
    fn ckpt_dist_store_get(
        store: *mut c_void,
        key: *const u8,
        key_len: usize,
        ctx: *mut c_void,
        push: MsgFn,
        err: *mut c_void,
        set_err: MsgFn,
    ) -> i32;
    #[allow(clippy::too_many_arguments)]
    fn ckpt_dist_pg_new_gloo(
        store: *mut c_void,
        rank: i32,
        world: i32,
        ifname: *const u8,
        ifname_len: usize,
        master: *const u8,
        master_len: usize,
        master_port: u16,
        timeout_ms: i64,
        threads: i32,
        out: *mut *mut c_void,
        err: *mut c_void,
        set_err: MsgFn,
    ) -> i32;
    fn ckpt_dist_has_nccl() -> i32;
    fn ckpt_dist_pg_new_nccl(
        store: *mut c_void,
        rank: i32,
        world: i32,
        timeout_ms: i64,
        out: *mut *mut c_void,
        err: *mut c_void,
        set_err: MsgFn,
    ) -> i32;
    fn ckpt_dist_pg_free(group: *mut c_void);
    fn ckpt_dist_all_reduce(
        group: *mut c_void,
        t: *mut C_tensor,
        op: i32,
        err: *mut c_void,
        set_err: MsgFn,
    ) -> i32;
    fn ckpt_dist_broadcast(
        group: *mut c_void,
        t: *mut C_tensor,
        root: i32,
        err: *mut c_void,
        set_err: MsgFn,
    ) -> i32;
    fn ckpt_dist_all_gather(
        group: *mut c_void,
        outs: *const *mut C_tensor,
        n_outs: usize,
        input: *mut C_tensor,
        err: *mut c_void,
        set_err: MsgFn,
    ) -> i32;
    fn ckpt_dist_reduce_scatter(
        group: *mut c_void,
        output: *mut C_tensor,
        inputs: *const *mut C_tensor,
        n_inputs: usize,
        op: i32,
        err: *mut c_void,
        set_err: MsgFn,
    ) -> i32;
    fn ckpt_dist_barrier(group: *mut c_void, err: *mut c_void, set_err: MsgFn) -> i32;
    fn ckpt_dist_broadcast_coalesced(
        group: *mut c_void,
        ts: *const *mut C_tensor,
        n: usize,
        buffer_bytes: i64,
        root: i32,
        err: *mut c_void,
        set_err: MsgFn,
    ) -> i32;
    #[allow(clippy::too_many_arguments)]
    fn ckpt_ddp_new(
        group: *mut c_void,
        params: *const *mut C_tensor,
        n_params: usize,
        buffers: *const *mut C_tensor,
        n_buffers: usize,
        bucket_bytes: i64,
        first_bucket_bytes: i64,
        find_unused: i32,
        static_graph: i32,
        record_launches: i32,
        out: *mut *mut c_void,
        err: *mut c_void,
        set_err: MsgFn,
    ) -> i32;
    fn ckpt_ddp_free(ddp: *mut c_void);
    fn ckpt_ddp_pre_forward(ddp: *mut c_void, sync: i32, err: *mut c_void, set_err: MsgFn) -> i32;
    #[allow(clippy::too_many_arguments)]
    fn ckpt_ddp_post_forward(
        ddp: *mut c_void,
        outputs: *const *mut C_tensor,
        n: usize,
        sync: i32,
        ctx: *mut c_void,
        push: PushFn,
        err: *mut c_void,
        set_err: MsgFn,
    ) -> i32;
    fn ckpt_ddp_describe(
        ddp: *mut c_void,
        ctx: *mut c_void,
        push: MsgFn,
        err: *mut c_void,
        set_err: MsgFn,
    ) -> i32;
}

/// `ckpt_msg_fn` appending to a `Vec<u8>`: receives bytes from C++.
extern "C" fn push_bytes(sink: *mut c_void, msg: *const u8, len: usize) {
    guarded(None, || {
        // SAFETY: `sink` is the `Vec<u8>` of the Rust caller of the C++ entry point that
        // calls this, alive until that entry point returns; C++ passes `len` bytes at
        // `msg`, alive for the call.
        let (out, bytes) = unsafe {
            (
                &mut *(sink as *mut Vec<u8>),
                std::slice::from_raw_parts(msg, len),
            )
        };
        out.extend_from_slice(bytes);
        Ok(())
    });
}

/// Runs a C++ entry point, `f(err, set_err)`, with an error slot (`ffi::call_cpp`);
/// `Err(CkptError::Dist)` with its message when it reports one.
fn call(f: impl FnOnce(*mut c_void, MsgFn) -> i32) -> Result<(), CkptError> {
    crate::ffi::call_cpp(|slot| f(slot.slot, slot.set)).map_err(|message| {
        CkptError::Dist(message.unwrap_or_else(|| "c10d failed without a message".into()))
    })
}

fn ptr(t: &Tensor) -> *mut C_tensor {
    t.as_ptr() as *mut C_tensor
}

/// An owned `c10d::Store` (TCPStore, maybe under a PrefixStore).
pub(crate) struct RawStore(*mut c_void);
// SAFETY: c10d stores are thread-safe (TCPStore serializes its client socket).
unsafe impl Send for RawStore {}
// SAFETY: as above.
unsafe impl Sync for RawStore {}

impl Drop for RawStore {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from `ckpt_dist_store_new` and is freed once.
        unsafe { ckpt_dist_store_free(self.0) }
    }
}

impl RawStore {
    pub(crate) fn new(
        host: &str,
        port: u16,
        world: usize,
        is_server: bool,
        timeout_ms: i64,
        prefix: &str,
    ) -> Result<Self, CkptError> {
        let mut out = std::ptr::null_mut();
        call(|err, set_err| {
            // SAFETY: strings are passed with their lengths; `out` and `err` outlive the call.
            unsafe {
                ckpt_dist_store_new(
                    host.as_ptr(),
                    host.len(),
                    port,
                    world as i32,
                    is_server as i32,
                    timeout_ms,
                    prefix.as_ptr(),
                    prefix.len(),
                    &mut out,
                    err,
                    set_err,
                )
            }
        })?;
        Ok(RawStore(out))
    }

    pub(crate) fn set(&self, key: &str, value: &[u8]) -> Result<(), CkptError> {
        // SAFETY: slices are passed with their lengths; `self.0` is live.
        call(|err, set_err| unsafe {
            ckpt_dist_store_set(
                self.0,
                key.as_ptr(),
                key.len(),
                value.as_ptr(),
                value.len(),
                err,
                set_err,
            )
        })
    }

    pub(crate) fn get(&self, key: &str) -> Result<Vec<u8>, CkptError> {
        let mut out = Vec::new();
        let ctx = &mut out as *mut Vec<u8> as *mut c_void;
        // SAFETY: `ctx` is the live `out`; `self.0` is live.
        call(|err, set_err| unsafe {
            ckpt_dist_store_get(
                self.0,
                key.as_ptr(),
                key.len(),
                ctx,
                push_bytes,
                err,
                set_err,
            )
        })?;
        Ok(out)
    }
}

/// Whether the C++ was compiled with c10d's NCCL backend (the `nccl` feature).
pub(crate) fn has_nccl() -> bool {
    // SAFETY: no arguments, no state.
    unsafe { ckpt_dist_has_nccl() != 0 }
}

/// An owned `c10d::ProcessGroup` with its Gloo (CPU) or NCCL (CUDA) backend.
pub(crate) struct RawGroup(*mut c_void);
// SAFETY: c10d process groups are used from any thread (the Reducer calls them from
// autograd's threads); their work queue is internally synchronized.
unsafe impl Send for RawGroup {}
// SAFETY: as above.
unsafe impl Sync for RawGroup {}

impl Drop for RawGroup {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from `ckpt_dist_pg_new_gloo` or `_nccl`, freed once.
        unsafe { ckpt_dist_pg_free(self.0) }
    }
}

impl RawGroup {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new_gloo(
        store: &RawStore,
        rank: usize,
        world: usize,
        ifname: &str,
        master: &str,
        master_port: u16,
        timeout_ms: i64,
        threads: i32,
    ) -> Result<Self, CkptError> {
        let mut out = std::ptr::null_mut();
        call(|err, set_err| {
            // SAFETY: strings with lengths; `store.0` is live; `out`/`err` outlive the call.
            unsafe {
                ckpt_dist_pg_new_gloo(
                    store.0,
                    rank as i32,
                    world as i32,
                    ifname.as_ptr(),
                    ifname.len(),
                    master.as_ptr(),
                    master.len(),
                    master_port,
                    timeout_ms,
                    threads,
                    &mut out,
                    err,
                    set_err,
                )
            }
        })?;
        Ok(RawGroup(out))
    }

    /// An NCCL group (the caller has checked that CUDA is available).
    pub(crate) fn new_nccl(
        store: &RawStore,
        rank: usize,
        world: usize,
        timeout_ms: i64,
    ) -> Result<Self, CkptError> {
        let mut out = std::ptr::null_mut();
        call(|err, set_err| {
            // SAFETY: `store.0` is live; `out`/`err` outlive the call.
            unsafe {
                ckpt_dist_pg_new_nccl(
                    store.0,
                    rank as i32,
                    world as i32,
                    timeout_ms,
                    &mut out,
                    err,
                    set_err,
                )
            }
        })?;
        Ok(RawGroup(out))
    }

    pub(crate) fn all_reduce(&self, t: &Tensor, op: i32) -> Result<(), CkptError> {
        // SAFETY: `t` is a live tensor; `self.0` is live.
        call(|err, set_err| unsafe { ckpt_dist_all_reduce(self.0, ptr(t), op, err, set_err) })
    }

    pub(crate) fn broadcast(&self, t: &Tensor, root: i32) -> Result<(), CkptError> {
        // SAFETY: as in `all_reduce`.
        call(|err, set_err| unsafe { ckpt_dist_broadcast(self.0, ptr(t), root, err, set_err) })
    }

    pub(crate) fn all_gather(&self, outs: &[Tensor], input: &Tensor) -> Result<(), CkptError> {
        let ptrs: Vec<_> = outs.iter().map(ptr).collect();
        // SAFETY: `ptrs` holds live tensors and outlives the call.
        call(|err, set_err| unsafe {
            ckpt_dist_all_gather(self.0, ptrs.as_ptr(), ptrs.len(), ptr(input), err, set_err)
        })
    }

    pub(crate) fn reduce_scatter(
        &self,
        output: &Tensor,
        inputs: &[Tensor],
        op: i32,
    ) -> Result<(), CkptError> {
        let ptrs: Vec<_> = inputs.iter().map(ptr).collect();
        // SAFETY: as in `all_gather`.
        call(|err, set_err| unsafe {
            ckpt_dist_reduce_scatter(
                self.0,
                ptr(output),
                ptrs.as_ptr(),
                ptrs.len(),
                op,
                err,
                set_err,
            )
        })
    }

    pub(crate) fn broadcast_coalesced(
        &self,
        ts: &[Tensor],
        buffer_bytes: i64,
        root: i32,
    ) -> Result<(), CkptError> {
        let ptrs: Vec<_> = ts.iter().map(ptr).collect();
        // SAFETY: `ptrs` holds live tensors and outlives the call; `self.0` is live.
        call(|err, set_err| unsafe {
            ckpt_dist_broadcast_coalesced(
                self.0,
                ptrs.as_ptr(),
                ptrs.len(),
                buffer_bytes,
                root,
                err,
                set_err,
            )
        })
    }

    pub(crate) fn barrier(&self) -> Result<(), CkptError> {
        // SAFETY: `self.0` is live.
        call(|err, set_err| unsafe { ckpt_dist_barrier(self.0, err, set_err) })
    }
}

/// An owned DDP state (the Reducer and its sink), see `csrc/dist.cpp`.
pub(crate) struct RawDdp(*mut c_void);
// SAFETY: the C++ state guards its mutable flags with a mutex; the Reducer locks its own.
unsafe impl Send for RawDdp {}

impl Drop for RawDdp {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from `ckpt_ddp_new` and is freed once.
        unsafe { ckpt_ddp_free(self.0) }
    }
}

impl RawDdp {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        group: &RawGroup,
        params: &[Tensor],
        buffers: &[Tensor],
        bucket_bytes: i64,
        first_bucket_bytes: i64,
        find_unused: bool,
        static_graph: bool,
        record_launches: bool,
    ) -> Result<Self, CkptError> {
        let ps: Vec<_> = params.iter().map(ptr).collect();
        let bs: Vec<_> = buffers.iter().map(ptr).collect();
        let mut out = std::ptr::null_mut();
        call(|err, set_err| {
            // SAFETY: `ps`/`bs` hold live tensors and outlive the call; `group.0` is live.
            unsafe {
                ckpt_ddp_new(
                    group.0,
                    ps.as_ptr(),
                    ps.len(),
                    bs.as_ptr(),
                    bs.len(),
                    bucket_bytes,
                    first_bucket_bytes,
                    find_unused as i32,
                    static_graph as i32,
                    record_launches as i32,
                    &mut out,
                    err,
                    set_err,
                )
            }
        })?;
        Ok(RawDdp(out))
    }

    pub(crate) fn pre_forward(&self, sync: bool) -> Result<(), CkptError> {
        // SAFETY: `self.0` is live.
        call(|err, set_err| unsafe { ckpt_ddp_pre_forward(self.0, sync as i32, err, set_err) })
    }

    pub(crate) fn post_forward(
        &self,
        outputs: &[Tensor],
        sync: bool,
    ) -> Result<Vec<Tensor>, CkptError> {
        let ps: Vec<_> = outputs.iter().map(ptr).collect();
        let mut out: Vec<Tensor> = Vec::with_capacity(outputs.len());
        let ctx = &mut out as *mut Vec<Tensor> as *mut c_void;
        // SAFETY: `ps` holds live tensors; `ctx` is the live `out`.
        call(|err, set_err| unsafe {
            ckpt_ddp_post_forward(
                self.0,
                ps.as_ptr(),
                ps.len(),
                sync as i32,
                ctx,
                push_tensor,
                err,
                set_err,
            )
        })?;
        Ok(out)
    }

    pub(crate) fn describe(&self) -> Result<String, CkptError> {
        let mut out = Vec::new();
        let ctx = &mut out as *mut Vec<u8> as *mut c_void;
        // SAFETY: `ctx` is the live `out`.
        call(|err, set_err| unsafe { ckpt_ddp_describe(self.0, ctx, push_bytes, err, set_err) })?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }
}

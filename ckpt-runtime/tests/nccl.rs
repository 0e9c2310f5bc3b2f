//! The NCCL backend of `ckpt::dist`, built with or without the `nccl` feature:
//! `cargo test -p ckpt-runtime --features nccl --test nccl` (what `./x.sh test` runs, so
//! CI compiles and links c10d's `ProcessGroupNCCL`). Without CUDA, asking for NCCL is a
//! `DistEnv` error saying why; with CUDA (and the feature), a one-rank NCCL group runs
//! collectives on the GPU. Tests that need a GPU skip with a printed reason.

use std::net::TcpListener;
use std::time::Duration;

use ckpt_runtime::CkptError;
use ckpt_runtime::dist::{self, Backend, InitOptions, ReduceOp};
use tch::{Device, Kind, Tensor};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn nccl_options() -> InitOptions {
    let mut o = InitOptions::new("127.0.0.1", free_port(), 0, 1);
    o.backend = Backend::Nccl;
    o.timeout = Duration::from_secs(60);
    o
}

#[test]
fn the_feature_decides_whether_nccl_is_built_in() {
    assert_eq!(Backend::Nccl.is_built(), cfg!(feature = "nccl"));
    assert!(Backend::Gloo.is_built() && Backend::Gloo.is_available());
    assert_eq!(
        Backend::Nccl.is_available(),
        cfg!(feature = "nccl") && tch::Cuda::is_available()
    );
}

#[test]
fn nccl_where_it_cannot_run_is_an_error_saying_why() {
    if Backend::Nccl.is_available() {
        eprintln!("skipped: NCCL can run here (built in, CUDA present)");
        return;
    }
    let err = dist::f_init(&nccl_options()).expect_err("NCCL cannot run here");
    let CkptError::DistEnv(msg) = err else {
        panic!("expected a DistEnv error, got {err:?}");
    };
    if cfg!(feature = "nccl") {
        assert!(msg.contains("needs CUDA"), "{msg}");
    } else {
        assert!(msg.contains("`nccl` feature"), "{msg}");
    }
}

#[test]
fn a_one_rank_nccl_group_reduces_cuda_tensors() {
    if !Backend::Nccl.is_available() {
        eprintln!(
            "skipped: NCCL is not available here (built in: {}, CUDA: {})",
            Backend::Nccl.is_built(),
            tch::Cuda::is_available()
        );
        return;
    }
    let pg = dist::f_init(&nccl_options()).expect("a one-rank NCCL group");
    let dev = Device::Cuda(0);
    let t = Tensor::arange(6, (Kind::Float, dev));
    pg.f_all_reduce(&t, ReduceOp::Sum).unwrap();
    assert_eq!(
        Vec::<f32>::try_from(t.to_device(Device::Cpu)).unwrap(),
        [0., 1., 2., 3., 4., 5.]
    );
    pg.f_all_reduce(&t, ReduceOp::Max).unwrap();
    pg.f_broadcast(&t, 0).unwrap();
    let all = pg.f_all_gather(&t).unwrap();
    assert_eq!(all.len(), 1);
    assert!(all[0].device().is_cuda());
    pg.f_barrier().unwrap();
    // A CPU tensor is refused with the reason.
    let cpu = Tensor::ones([2], (Kind::Float, Device::Cpu));
    assert!(matches!(
        pg.f_all_reduce(&cpu, ReduceOp::Sum),
        Err(CkptError::InvalidArgument(m)) if m.contains("NCCL") && m.contains("CUDA")
    ));
}

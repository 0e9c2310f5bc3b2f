//! Every rule's escape hatch, `#[ckpt::allow(..)]` on a statement. Outer bindings that a
//! segment assigns or mutates under a hatch leave it as outputs, so the change is seen
//! after the segment, as without the attribute.
use ckpt::{checkpointed, ShallowClone};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use tch::{Device, Kind, Tensor};

mod rand {
    pub fn thread_rng() -> u64 {
        4
    }
}

#[derive(ShallowClone)]
struct Stats {
    calls: Arc<AtomicU32>,
    log: Arc<Mutex<Vec<i64>>>,
}

#[checkpointed]
fn forward(mut xs: Tensor, stats: &Stats) -> (Tensor, i64) {
    let mut count = 0;
    let mut seen = Vec::new();
    ckpt::cut!();
    #[ckpt::allow(io)]
    if !ckpt::is_recomputing() {
        println!("forward of {:?}", xs.size());
    }
    #[ckpt::allow(mutation)]
    stats.log.lock().unwrap().push(xs.size()[0]);
    #[ckpt::allow(mutation)]
    stats.calls.fetch_add(1, Ordering::Relaxed);
    #[ckpt::allow(inplace)]
    let _ = xs.abs_();
    #[ckpt::allow(assign)]
    count += 1;
    #[ckpt::allow(mutation)]
    seen.push(count);
    #[ckpt::allow(unsafe)]
    let n = unsafe { std::ptr::read(&xs.numel()) };
    #[ckpt::allow(rng)]
    let r = rand::thread_rng();
    let ys = xs.sigmoid() * (n as f64 + r as f64);
    ckpt::cut!();
    assert_eq!(seen, vec![1]);
    (ys.sum(Kind::Float), count)
}

fn main() {
    let stats = Stats {
        calls: Arc::new(AtomicU32::new(0)),
        log: Arc::new(Mutex::new(Vec::new())),
    };
    let xs = Tensor::randn([3], (Kind::Float, Device::Cpu));
    let (loss, count) = forward(xs, &stats);
    assert_eq!(count, 1, "the assignment is seen after the segment");
    loss.backward();
    assert_eq!(stats.log.lock().unwrap().len(), 2, "forward and recompute");
    assert_eq!(stats.calls.load(Ordering::Relaxed), 2);
}

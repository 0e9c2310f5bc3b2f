use ckpt::checkpointed;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use tch::Tensor;

static CALLS: AtomicU64 = AtomicU64::new(0);

#[checkpointed]
fn f(xs: &Tensor, log: &RefCell<Vec<i64>>, last: &Mutex<Option<Tensor>>) -> Tensor {
    let ys = xs.relu();
    log.borrow_mut().push(ys.size()[0]);
    *last.lock().unwrap() = Some(ys.shallow_clone());
    CALLS.fetch_add(1, Ordering::Relaxed);
    let zs = ys.sigmoid();
    ckpt::cut!();
    zs.tanh()
}

fn main() {}

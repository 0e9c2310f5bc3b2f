// The side-effect rules follow a local to the outside value it refers to: a reference,
// a shallow clone, an `as_ref`/`borrow`/`deref`, an outside value moved in, or the
// parameter of a closure given to a method of an outside value.
use ckpt::checkpointed;
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tch::Tensor;

static GLOBAL: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static TL: Cell<usize> = const { Cell::new(0) };
}

#[derive(Debug, ckpt::ShallowClone)]
struct Model {
    scale: Tensor,
    hits: Arc<AtomicUsize>,
}

impl Model {
    #[checkpointed]
    fn forward(&self, xs: &Tensor) -> Tensor {
        let ys = {
            let mut s = self.scale.shallow_clone();
            let _ = tch::no_grad(|| s.f_mul_(&Tensor::from(2.0f32)).unwrap());
            xs * &self.scale
        };
        let hits = &self.hits;
        hits.fetch_add(1, Ordering::SeqCst);
        self.hits.as_ref().fetch_add(1, Ordering::SeqCst);
        let g = &GLOBAL;
        let h = g;
        h.fetch_add(1, Ordering::SeqCst);
        TL.with(|c| c.set(c.get() + 1));
        let zs = ys.sigmoid();
        ckpt::cut!();
        zs.tanh()
    }
}

#[checkpointed]
fn owned(xs: Tensor) -> Tensor {
    let mut t = xs;
    let _ = t.relu_();
    let ys = t.sigmoid();
    ckpt::cut!();
    ys.tanh()
}

#[checkpointed]
fn op_assign_on_a_shallow_clone(xs: &Tensor) -> Tensor {
    let ys = {
        let mut h = xs.shallow_clone();
        h += 1.0;
        h.sin()
    };
    ckpt::cut!();
    ys.tanh()
}

fn main() {}

//! `ckpt::checkpoint`: gradients with checkpointing equal gradients without it, bit for
//! bit on CPU, across the input/output shapes, options and situations of issue 2.

mod common;

use ckpt::{Carry, ShallowClone};
use common::{assert_all_equal, grads_of, input, params};
use tch::nn::{self, Module, ModuleT};
use tch::{Device, Kind, Tensor};

fn mlp(vs: &nn::VarStore, dims: &[i64]) -> Vec<nn::Linear> {
    dims.windows(2)
        .enumerate()
        .map(|(i, w)| nn::linear(vs.root() / format!("l{i}"), w[0], w[1], Default::default()))
        .collect()
}

fn run_mlp(layers: &[nn::Linear], x: &Tensor) -> Tensor {
    layers
        .iter()
        .fold(x.shallow_clone(), |h, l| l.forward(&h).relu())
}

#[test]
fn mlp_chain_matches_plain() {
    tch::manual_seed(1);
    let vs = nn::VarStore::new(Device::Cpu);
    let layers = mlp(&vs, &[16, 32, 32, 32, 8]);
    let x = input(&[4, 16]);
    let mut ps = params(&vs);
    ps.push(x.shallow_clone());

    let plain = run_mlp(&layers, &x).square().sum(Kind::Float);
    let want = grads_of(&plain, &ps);

    // Two segments of two layers each, chained.
    let (a, b) = (layers[..2].to_vec_shallow(), layers[2..].to_vec_shallow());
    let h: Tensor = ckpt::checkpoint(move |x: Tensor| run_mlp(&a, &x), x.shallow_clone());
    let y: Tensor = ckpt::checkpoint(move |h: Tensor| run_mlp(&b, &h), h);
    let loss = y.square().sum(Kind::Float);
    assert!(loss.equal(&plain), "forward values differ");
    let got = grads_of(&loss, &ps);
    assert_all_equal("grads", &got, &want);
}

trait ToVecShallow<T> {
    fn to_vec_shallow(&self) -> Vec<T>;
}
impl<T: ShallowClone> ToVecShallow<T> for [T] {
    fn to_vec_shallow(&self) -> Vec<T> {
        self.iter().map(ShallowClone::shallow_clone).collect()
    }
}

#[test]
fn residual_blocks_match_plain() {
    tch::manual_seed(2);
    let vs = nn::VarStore::new(Device::Cpu);
    let blocks: Vec<nn::Linear> = (0..6)
        .map(|i| nn::linear(vs.root() / format!("b{i}"), 24, 24, Default::default()))
        .collect();
    let block = |l: &nn::Linear, x: &Tensor| x + l.forward(x).gelu("none");
    let x = input(&[3, 24]);
    let mut ps = params(&vs);
    ps.push(x.shallow_clone());

    let plain = blocks
        .iter()
        .fold(x.shallow_clone(), |h, l| block(l, &h))
        .sum(Kind::Float);
    let want = grads_of(&plain, &ps);

    let mut h = x.shallow_clone();
    for pair in blocks.chunks(2) {
        let pair = pair.to_vec_shallow();
        h = ckpt::checkpoint(move |x: Tensor| pair.iter().fold(x, |h, l| block(l, &h)), h);
    }
    let loss = h.sum(Kind::Float);
    assert!(loss.equal(&plain));
    assert_all_equal("grads", &grads_of(&loss, &ps), &want);
}

#[test]
fn several_inputs_and_outputs_with_non_tensor_values() {
    tch::manual_seed(3);
    let vs = nn::VarStore::new(Device::Cpu);
    let l = nn::linear(vs.root() / "l", 8, 8, Default::default());
    let a = input(&[2, 8]);
    let b = input(&[2, 8]);
    let mask = Some(Tensor::from_slice(&[1.0f32, 0.0]).view([2, 1]));
    let mut ps = params(&vs);
    ps.push(a.shallow_clone());
    ps.push(b.shallow_clone());

    let f = |l: &nn::Linear, a: &Tensor, b: &Tensor, mask: &Option<Tensor>, scale: f64, n: i64| {
        let h = l.forward(&(a * scale + b)).tanh();
        let h = match mask {
            Some(m) => &h * m,
            None => h,
        };
        let parts: Vec<Tensor> = (0..n).map(|k| &h * (k as f64 + 1.0)).collect();
        (Tensor::cat(&parts, 1), h.argmax(-1, false), n * 2)
    };
    let (p1, p_idx, p_n) = f(&l, &a, &b, &mask, 0.5, 3);
    let plain = p1.sum(Kind::Float);
    let want = grads_of(&plain, &ps);

    let lc = l.shallow_clone();
    type In = ((Tensor, Tensor), Option<Tensor>, [f64; 1], Carry<i64>);
    let (c1, c_idx, c_n): (Tensor, Tensor, i64) = ckpt::checkpoint(
        move |((a, b), mask, [scale], Carry(n)): In| f(&lc, &a, &b, &mask, scale, n),
        (
            (a.shallow_clone(), b.shallow_clone()),
            mask.shallow_clone(),
            [0.5],
            Carry(3i64),
        ),
    );
    assert_eq!(c_n, p_n);
    assert!(c_idx.equal(&p_idx));
    assert!(
        !c_idx.requires_grad(),
        "integer outputs are not differentiable"
    );
    let loss = c1.sum(Kind::Float);
    assert!(loss.equal(&plain));
    assert_all_equal("grads", &grads_of(&loss, &ps), &want);
}

#[test]
fn vec_of_tensors_in_and_out() {
    tch::manual_seed(4);
    let xs: Vec<Tensor> = (0..4).map(|_| input(&[3, 5])).collect();
    let f = |xs: Vec<Tensor>| {
        xs.windows(2)
            .map(|w| (&w[0] * &w[1]).sin())
            .collect::<Vec<_>>()
    };
    let plain = Tensor::stack(&f(xs.shallow_clone()), 0).sum(Kind::Float);
    let want = grads_of(&plain, &xs);
    let outs: Vec<Tensor> = ckpt::checkpoint(f, xs.shallow_clone());
    assert_eq!(outs.len(), 3);
    let loss = Tensor::stack(&outs, 0).sum(Kind::Float);
    assert_all_equal("grads", &grads_of(&loss, &xs), &want);
}

/// Token ids (integers) and a frozen input: no input requires grad, yet the parameters
/// inside the segment get their gradients (pytorch#7617 does not happen here).
#[test]
fn parameters_get_gradients_when_no_input_requires_grad() {
    tch::manual_seed(8);
    let vs = nn::VarStore::new(Device::Cpu);
    let emb = nn::embedding(vs.root() / "emb", 50, 16, Default::default());
    let l = nn::linear(vs.root() / "l", 16, 4, Default::default());
    let ids = Tensor::from_slice(&[1i64, 7, 7, 42, 3, 0]).view([2, 3]);
    let ps = params(&vs);
    let f = |emb: &nn::Embedding, l: &nn::Linear, ids: &Tensor| {
        l.forward(&emb.forward(ids)).mean_dim(1, false, Kind::Float)
    };

    let plain = f(&emb, &l, &ids).sum(Kind::Float);
    let want = grads_of(&plain, &ps);
    let (e, lc) = (emb.shallow_clone(), l.shallow_clone());
    let y: Tensor = ckpt::checkpoint(move |ids: Tensor| f(&e, &lc, &ids), ids.shallow_clone());
    assert!(y.requires_grad());
    let got = grads_of(&y.sum(Kind::Float), &ps);
    assert!(got.iter().all(Tensor::defined));
    assert_all_equal("grads", &got, &want);

    // A frozen float input behaves the same.
    let frozen = Tensor::randn([2, 16], (Kind::Float, Device::Cpu));
    let lc = l.shallow_clone();
    let plain = l.forward(&frozen).sum(Kind::Float);
    let want = grads_of(&plain, &ps);
    let y: Tensor = ckpt::checkpoint(move |x: Tensor| lc.forward(&x), frozen.shallow_clone());
    assert_all_equal("grads", &grads_of(&y.sum(Kind::Float), &ps), &want);
}

/// Outputs that need no gradient (a closure that touches no parameter, inputs that do
/// not require grad) are fine, and backward through them is a no-op.
#[test]
fn outputs_that_need_no_grad() {
    let x = Tensor::randn([3, 3], (Kind::Float, Device::Cpu));
    let y: Tensor = ckpt::checkpoint(|x: Tensor| x.exp(), x.shallow_clone());
    assert!(y.equal(&x.exp()));
    let w = input(&[3, 3]);
    let loss = (&y * &w).sum(Kind::Float);
    loss.backward();
    assert!(w.grad().equal(&x.exp()));
}

#[test]
fn model_dropped_before_backward() {
    tch::manual_seed(9);
    let x = input(&[4, 8]);
    let (loss, w, want) = {
        let vs = nn::VarStore::new(Device::Cpu);
        let l = nn::linear(vs.root() / "l", 8, 8, Default::default());
        let w = l.ws.shallow_clone();
        let plain = l.forward(&x).tanh().sum(Kind::Float);
        let want = grads_of(&plain, std::slice::from_ref(&w));
        let lc = l.shallow_clone();
        let y: Tensor = ckpt::checkpoint(move |x: Tensor| lc.forward(&x).tanh(), x.shallow_clone());
        (y.sum(Kind::Float), w, want)
        // `vs` and `l` are dropped here, before backward.
    };
    loss.backward();
    assert!(w.grad().equal(&want[0]));
}

#[test]
fn backward_on_another_thread() {
    tch::manual_seed(10);
    let vs = nn::VarStore::new(Device::Cpu);
    let l = nn::linear(vs.root() / "l", 8, 8, Default::default());
    let x = input(&[4, 8]);
    let ps = params(&vs);
    let want = grads_of(&l.forward(&x).sin().sum(Kind::Float), &ps);
    let lc = l.shallow_clone();
    let y: Tensor = ckpt::checkpoint(move |x: Tensor| lc.forward(&x).sin(), x.shallow_clone());
    let loss = y.sum(Kind::Float);
    let forward_thread = std::thread::current().id();
    std::thread::spawn(move || {
        assert_ne!(std::thread::current().id(), forward_thread);
        loss.backward();
    })
    .join()
    .unwrap();
    let got: Vec<Tensor> = ps.iter().map(|p| p.grad().copy()).collect();
    assert_all_equal("grads", &got, &want);
}

#[test]
fn nested_checkpoints() {
    tch::manual_seed(11);
    let vs = nn::VarStore::new(Device::Cpu);
    let layers = mlp(&vs, &[8, 8, 8, 8, 8]);
    let x = input(&[2, 8]);
    let mut ps = params(&vs);
    ps.push(x.shallow_clone());
    let want = grads_of(&run_mlp(&layers, &x).sum(Kind::Float), &ps);

    let inner = layers[1..3].to_vec_shallow();
    let (first, last) = (layers[0].shallow_clone(), layers[3].shallow_clone());
    let y: Tensor = ckpt::checkpoint(
        move |x: Tensor| {
            let h = first.forward(&x).relu();
            let inner = inner.to_vec_shallow();
            let h: Tensor = ckpt::checkpoint(move |h: Tensor| run_mlp(&inner, &h), h);
            last.forward(&h).relu()
        },
        x.shallow_clone(),
    );
    assert_all_equal("grads", &grads_of(&y.sum(Kind::Float), &ps), &want);
}

#[test]
fn under_no_grad_it_just_runs_the_closure() {
    use std::sync::Arc;
    // A node would own the closure (and so `token`) for as long as `y` lives; without
    // one the closure is dropped once it has run. (`live_segments` is process-wide, so
    // the tests running beside this one would make a count of it racy.)
    let token = Arc::new(());
    let held = Arc::clone(&token);
    let x = input(&[2, 2]);
    let y: Tensor = tch::no_grad(|| {
        ckpt::checkpoint(
            move |x: Tensor| {
                let _held = &held;
                &x * 2.0
            },
            x.shallow_clone(),
        )
    });
    assert!(!y.requires_grad());
    assert!(y.equal(&(&x * 2.0).detach()));
    assert_eq!(Arc::strong_count(&token), 1, "no node was created");
}

#[test]
fn is_recomputing_is_true_only_in_backward() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (fwd, re) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (f2, r2) = (fwd.clone(), re.clone());
    let x = input(&[2]);
    assert!(!ckpt::is_recomputing());
    let y: Tensor = ckpt::checkpoint(
        move |x: Tensor| {
            if ckpt::is_recomputing() { &r2 } else { &f2 }.fetch_add(1, Ordering::SeqCst);
            x.sin()
        },
        x.shallow_clone(),
    );
    assert_eq!(
        (fwd.load(Ordering::SeqCst), re.load(Ordering::SeqCst)),
        (1, 0)
    );
    y.sum(Kind::Float).backward();
    assert_eq!(
        (fwd.load(Ordering::SeqCst), re.load(Ordering::SeqCst)),
        (1, 1)
    );
    assert!(!ckpt::is_recomputing());
    assert!(x.grad().equal(&x.cos().detach()));
}

/// `Tensor::run_backward` with respect to a checkpoint input works; gradients of
/// captured parameters are not computed that way (undefined), as documented.
#[test]
fn run_backward_with_respect_to_inputs() {
    tch::manual_seed(12);
    let vs = nn::VarStore::new(Device::Cpu);
    let l = nn::linear(vs.root() / "l", 6, 6, Default::default());
    let x = input(&[3, 6]);
    let plain = l.forward(&x).tanh().sum(Kind::Float);
    let want = Tensor::run_backward(&[&plain], &[&x], false, false);
    let lc = l.shallow_clone();
    let y: Tensor = ckpt::checkpoint(move |x: Tensor| lc.forward(&x).tanh(), x.shallow_clone());
    let loss = y.sum(Kind::Float);
    let got = Tensor::run_backward(&[&loss], &[&x], false, false);
    assert!(got[0].equal(&want[0]));
    assert!(
        !l.ws.grad().defined(),
        "run_backward must not accumulate into .grad"
    );
}

/// A closure that captures a tensor computed outside the segment (not a leaf) is
/// followed by `backward()`: the gradient reaches what that tensor was computed from.
/// (`run_backward` with explicit inputs does not see that path: documented on
/// `checkpoint`.)
#[test]
fn backward_through_a_captured_computed_tensor() {
    let x = input(&[3]);
    let z = input(&[3]);
    let h = &x * 2.0;
    let hc = h.shallow_clone();
    let y: Tensor = ckpt::checkpoint(move |z: Tensor| &z * &hc, z.shallow_clone());
    (y + h).sum(Kind::Float).backward();
    assert!(x.grad().equal(&(z.detach() * 2.0 + 2.0)), "d/dx = 2z + 2");
    assert!(z.grad().equal(&(x.detach() * 2.0)), "d/dz = 2x");
}

/// Double backward (create_graph) differentiates through the recompute.
#[test]
fn double_backward() {
    let x = input(&[5]);
    let f = |x: &Tensor| x.pow_tensor_scalar(3).sum(Kind::Float);
    let g_plain = Tensor::run_backward(&[&f(&x)], &[&x], true, true).remove(0);
    let gg_plain =
        Tensor::run_backward(&[&g_plain.sum(Kind::Float)], &[&x], false, false).remove(0);
    let y: Tensor = ckpt::checkpoint(move |x: Tensor| f(&x), x.shallow_clone());
    let g = Tensor::run_backward(&[&y], &[&x], true, true).remove(0);
    assert!(g.equal(&g_plain));
    assert!(g.requires_grad());
    let gg = Tensor::run_backward(&[&g.sum(Kind::Float)], &[&x], false, false).remove(0);
    assert!(gg.equal(&gg_plain), "d/dx sum(3x^2) = 6x");
}

/// A module with a train flag (`ModuleT`) and batch norm running statistics: the
/// statistics update in forward and not again in the recompute (unlike PyTorch's
/// checkpoint, pytorch#96136), so they end as after one plain step.
#[test]
fn module_t_with_train_flag() {
    tch::manual_seed(13);
    let vs = nn::VarStore::new(Device::Cpu);
    let bn = nn::batch_norm1d(vs.root() / "bn", 6, Default::default());
    let x = input(&[5, 6]);
    let ps = params(&vs);
    let start = (bn.running_mean.copy(), bn.running_var.copy());
    let want = grads_of(&bn.forward_t(&x, true).square().sum(Kind::Float), &ps);
    let after_plain = (bn.running_mean.copy(), bn.running_var.copy());
    bn.running_mean.shallow_clone().copy_(&start.0);
    bn.running_var.shallow_clone().copy_(&start.1);
    let bc = bn.shallow_clone();
    let y: Tensor = ckpt::checkpoint(move |x: Tensor| bc.forward_t(&x, true), x.shallow_clone());
    let got = grads_of(&y.square().sum(Kind::Float), &ps);
    let trainable: Vec<Tensor> = ps
        .iter()
        .zip(&got)
        .filter(|(p, _)| p.requires_grad())
        .map(|(_, g)| g.shallow_clone())
        .collect();
    let want: Vec<Tensor> = ps
        .iter()
        .zip(&want)
        .filter(|(p, _)| p.requires_grad())
        .map(|(_, g)| g.shallow_clone())
        .collect();
    assert_all_equal("grads", &trainable, &want);
    assert!(
        bn.running_mean.equal(&after_plain.0),
        "running_mean updated once"
    );
    assert!(
        bn.running_var.equal(&after_plain.1),
        "running_var updated once"
    );
}

/// Under CPU autocast (bfloat16) the forward's matmuls run in bfloat16; backward runs
/// outside autocast, yet the recompute replays the forward's autocast state, so shapes,
/// dtypes (checked) and gradients match the plain autocast run.
#[test]
fn recompute_replays_the_autocast_state() {
    tch::manual_seed(14);
    let vs = nn::VarStore::new(Device::Cpu);
    let l = nn::linear(vs.root() / "l", 16, 16, Default::default());
    let x = input(&[4, 16]);
    let mut ps = params(&vs);
    ps.push(x.shallow_clone());
    let plain = ckpt::amp::autocast(Device::Cpu, Kind::BFloat16, || l.forward(&x).relu());
    assert_eq!(plain.kind(), Kind::BFloat16);
    let want = grads_of(&plain.to_kind(Kind::Float).sum(Kind::Float), &ps);
    let lc = l.shallow_clone();
    let y: Tensor = ckpt::amp::autocast(Device::Cpu, Kind::BFloat16, || {
        ckpt::checkpoint(move |x: Tensor| lc.forward(&x).relu(), x.shallow_clone())
    });
    assert_eq!(y.kind(), Kind::BFloat16);
    let got = grads_of(&y.to_kind(Kind::Float).sum(Kind::Float), &ps);
    assert_all_equal("grads", &got, &want);
    assert!(
        ckpt::amp::f_autocast(Device::Cpu, Kind::Float, || ()).is_err(),
        "autocast to float32 is rejected"
    );
}

/// Casts that autocast makes during a recompute (bfloat16 copies of the weights) must not
/// outlive it: three SGD steps under autocast, with the weights updated in place after
/// each backward, give the plain run's losses (the recompute opens its own autocast
/// region, whose end clears libtorch's cast cache).
#[test]
fn autocast_casts_do_not_outlive_the_recompute() {
    // Drawn once: the global generator is shared with the other tests of this binary.
    let w0 = Tensor::randn([16, 16], (Kind::Float, Device::Cpu));
    let x = Tensor::randn([8, 16], (Kind::Float, Device::Cpu));
    let train = |checkpointed: bool| -> Vec<f64> {
        let w = w0.copy().set_requires_grad(true);
        (0..3)
            .map(|_| {
                let y = ckpt::amp::autocast(Device::Cpu, Kind::BFloat16, || {
                    if checkpointed {
                        let w2 = w.shallow_clone();
                        ckpt::checkpoint(move |x: Tensor| x.matmul(&w2).relu(), x.shallow_clone())
                    } else {
                        x.matmul(&w).relu()
                    }
                });
                let loss = y.to_kind(Kind::Float).sum(Kind::Float);
                loss.backward();
                tch::no_grad(|| {
                    let mut w = w.shallow_clone();
                    let _ = w.f_sub_(&(w.grad() * 0.01)).unwrap();
                    let _ = w.grad().zero_();
                });
                loss.double_value(&[])
            })
            .collect()
    };
    let plain = train(false);
    assert_ne!(plain[0], plain[1], "the weights change between steps");
    assert_eq!(train(true), plain);
}

/// A segment may return a tensor from outside it as is (a captured parameter, a buffer,
/// or the result of an op that returns its argument, such as `to_device` to the same
/// device): the tensor itself is left alone (a parameter stays a leaf, a buffer does not
/// start to require grad), and backward computes the plain gradients.
#[test]
fn an_output_that_is_a_tensor_from_outside_the_segment() {
    tch::manual_seed(16);
    let vs = nn::VarStore::new(Device::Cpu);
    let w = vs.root().randn("w", &[3], 0.0, 1.0);
    let buffer = Tensor::ones([3], (Kind::Float, Device::Cpu));
    let x = input(&[3]);
    let (wc, bc) = (w.shallow_clone(), buffer.shallow_clone());
    let (y, p, b): (Tensor, Tensor, Tensor) = ckpt::checkpoint(
        move |x: Tensor| (&x * &wc, wc.to_device(Device::Cpu), bc.shallow_clone()),
        x.shallow_clone(),
    );
    assert!(
        w.is_leaf() && w.requires_grad(),
        "the parameter is still a leaf"
    );
    assert!(!buffer.requires_grad(), "the buffer does not require grad");
    assert!(p.equal(&w) && b.equal(&buffer));
    (y.sum(Kind::Float) + p.sum(Kind::Float) * 2.0).backward();
    assert!(
        w.grad().equal(&(x.detach() + 2.0)),
        "d/dw [sum(x*w) + 2 sum(w)] = x + 2"
    );
    assert!(x.grad().equal(&w.detach()));
}

/// An output that is one of the segment's inputs (returned unchanged, as `#[checkpointed]`
/// does with a `let mut` binding that later code reads) is a view of it through the node:
/// gradients equal the plain run's. A checkpoint keeps its inputs until backward, so an
/// in-place op on one of them is an error, never a recompute from the changed value: on
/// that view at once (libtorch's), on the input itself at backward (naming the segment).
#[test]
fn inputs_returned_unchanged_and_inputs_changed_in_place() {
    tch::manual_seed(17);
    let x = input(&[4]);
    let plain = {
        let h = &x * 3.0;
        let g = (&h * 2.0).sin();
        grads_of(&(&h * &g).sum(Kind::Float), std::slice::from_ref(&x))
    };
    let keeps_h = || {
        let h = &x * 3.0;
        let (h2, g): (Tensor, Tensor) = ckpt::checkpoint_with(
            &ckpt::CheckpointOptions::new().name("keeps h"),
            |h: Tensor| {
                let g = (&h * 2.0).sin();
                (h, g)
            },
            h.shallow_clone(),
        );
        (h2, g)
    };
    let (h2, g) = keeps_h();
    let got = grads_of(&(&h2 * &g).sum(Kind::Float), std::slice::from_ref(&x));
    assert_all_equal("passthrough output", &plain, &got);

    let (mut h2, _) = keeps_h();
    let err = h2.f_relu_().unwrap_err().to_string();
    assert!(
        err.contains("is a view and is being modified inplace"),
        "{err}"
    );

    let mut h = &x * 3.0;
    let g: Tensor = ckpt::checkpoint_with(
        &ckpt::CheckpointOptions::new().name("keeps h"),
        |h: Tensor| (&h * 2.0).sin(),
        h.shallow_clone(),
    );
    let _ = h.relu_();
    let err = g.sum(Kind::Float).f_backward().unwrap_err().to_string();
    assert!(
        err.contains("checkpoint `keeps h`: an input of the segment was modified in place"),
        "{err}"
    );
}

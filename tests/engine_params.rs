//! Parameters seen by libtorch's engine: the tensors a segment captures through
//! `ShallowClone` (of `self` in `#[checkpointed]` and `model!`, of the modules of
//! `checkpoint_sequential`, or listed with `CheckpointOptions::parameters`) are inputs of
//! the checkpoint node. `Tensor::run_backward` with them as inputs returns their
//! gradients, equal to the plain model's; a layer used by two segments gets the sum.
//! (That each parameter is accumulated once per backward is what DDP's Reducer checks
//! without static graph: `tests/dist.rs`, `without_static_graph_*`.)

mod common;

use ckpt::{CheckpointOptions, ShallowClone, checkpoint_with, checkpointed, model};
use common::{assert_all_equal, params};
use tch::nn::{self, Module, ModuleT};
use tch::{Device, Kind, Tensor};

const D: i64 = 6;

fn linear(vs: &nn::VarStore, name: &str) -> nn::Linear {
    nn::linear(vs.root() / name, D, D, Default::default())
}

/// A net whose layer `shared` is used by two checkpointed segments and by the last,
/// inline, group.
#[derive(Debug, ckpt::ShallowClone)]
struct Net {
    a: nn::Linear,
    shared: nn::Linear,
    b: nn::Linear,
}

impl Net {
    fn new(vs: &nn::VarStore) -> Net {
        Net {
            a: linear(vs, "a"),
            shared: linear(vs, "shared"),
            b: linear(vs, "b"),
        }
    }

    fn plain(&self, x: &Tensor) -> Tensor {
        let h = self.a.forward(x).tanh();
        let h = self.shared.forward(&h).tanh() + h;
        let h = self.b.forward(&h).tanh();
        let h = self.shared.forward(&h).tanh() + h;
        let h = self.b.forward(&h).sigmoid();
        self.shared.forward(&h).sum(Kind::Float)
    }

    #[checkpointed(segments = 3)]
    fn checkpointed(&self, x: &Tensor) -> Tensor {
        let h = self.a.forward(x).tanh();
        let h = self.shared.forward(&h).tanh() + h;
        let h = self.b.forward(&h).tanh();
        let h = self.shared.forward(&h).tanh() + h;
        let h = self.b.forward(&h).sigmoid();
        self.shared.forward(&h).sum(Kind::Float)
    }
}

fn x() -> Tensor {
    Tensor::randn([4, D], (Kind::Float, Device::Cpu))
}

/// `l` then `act` on `x`, as one segment with `options`.
fn segment(
    options: &CheckpointOptions,
    l: &nn::Linear,
    act: fn(Tensor) -> Tensor,
    x: &Tensor,
) -> Tensor {
    let l = l.shallow_clone();
    checkpoint_with(
        options,
        move |x: Tensor| act(l.forward(&x)),
        x.shallow_clone(),
    )
}

/// `run_backward(&[loss], &params)` gradients: defined, as many as asked for.
fn run_backward(loss: &Tensor, wrt: &[Tensor]) -> Vec<Tensor> {
    Tensor::run_backward(&[loss], wrt, false, false)
}

#[test]
fn run_backward_returns_the_gradients_of_checkpointed_parameters() {
    tch::manual_seed(1);
    let vs = nn::VarStore::new(Device::Cpu);
    let net = Net::new(&vs);
    let x = x();
    let ps = params(&vs);
    let want = run_backward(&net.plain(&x), &ps);
    let got = run_backward(&net.checkpointed(&x), &ps);
    assert!(got.iter().all(Tensor::defined), "a gradient is undefined");
    assert_all_equal("run_backward through #[checkpointed]", &want, &got);
    // Nothing accumulated into .grad.
    assert!(ps.iter().all(|p| !p.grad().defined()));
    // backward() as before: each segment accumulates its part as soon as it is complete,
    // and the accumulator node runs once, after the last segment that used the
    // parameter. A parameter used only inside segments is summed in plain's order; the
    // shared layer, also used after the segments, gets its inline part added last
    // instead of first (float addition: the last bits may differ).
    net.checkpointed(&x).backward();
    let grads: Vec<Tensor> = ps.iter().map(Tensor::grad).collect();
    assert_all_equal(
        "backward() through #[checkpointed]",
        &want[..4],
        &grads[..4],
    );
    for (w, g) in want[4..].iter().zip(&grads[4..]) {
        let scale = w.abs().max().double_value(&[]);
        assert!(common::max_abs_diff(w, g) <= 1e-5 * scale, "shared layer");
    }
}

#[test]
fn run_backward_with_respect_to_some_parameters_and_the_input() {
    tch::manual_seed(2);
    let vs = nn::VarStore::new(Device::Cpu);
    let net = Net::new(&vs);
    let x = x().set_requires_grad(true);
    let wrt = [net.shared.ws.shallow_clone(), x.shallow_clone()];
    let want = run_backward(&net.plain(&x), &wrt);
    let got = run_backward(&net.checkpointed(&x), &wrt);
    assert_all_equal("shared weight and input", &want, &got);
}

/// Double backward through a parameter: the gradient's own graph leads back into the
/// recomputed forward, whose edges to the parameter then pass on to its accumulator.
#[test]
fn double_backward_with_respect_to_a_parameter() {
    tch::manual_seed(3);
    let vs = nn::VarStore::new(Device::Cpu);
    let net = Net::new(&vs);
    let x = x();
    let w = net.shared.ws.shallow_clone();
    let second = |loss: Tensor| {
        let g = Tensor::run_backward(&[&loss], &[&w], true, true).remove(0);
        assert!(g.requires_grad());
        let gg = run_backward(&g.square().sum(Kind::Float), std::slice::from_ref(&w));
        (g.detach(), gg)
    };
    let (g_plain, gg_plain) = second(net.plain(&x));
    let (g, gg) = second(net.checkpointed(&x));
    assert!(g.equal(&g_plain));
    // The second-order graph sums the same terms grouped by segment: equal up to float32
    // rounding of the sums (a lost part would be off by the size of a term).
    let (want, got) = (&gg_plain[0], &gg[0]);
    let scale = want.abs().max().double_value(&[]);
    let diff = common::max_abs_diff(want, got);
    assert!(
        diff <= 1e-5 * scale,
        "d/dw |dL/dw|^2: {diff:e} of {scale:e}"
    );
}

model! {
    /// Four stages, the middle two in checkpointed segments.
    #[checkpointed(segments = 3)]
    struct Stack(p) {
        l0: nn::Linear = nn::linear(p, D, D, Default::default()),
        tanh,
        l1: nn::Linear = nn::linear(p, D, D, Default::default()),
        tanh,
        l2: nn::Linear = nn::linear(p, D, D, Default::default()),
        tanh,
    }
}

#[test]
fn run_backward_through_a_model() {
    tch::manual_seed(4);
    let vs = nn::VarStore::new(Device::Cpu);
    let m = Stack::new(vs.root());
    let x = x();
    let ps = params(&vs);
    let plain = [&m.l0, &m.l1, &m.l2]
        .iter()
        .fold(x.shallow_clone(), |h, l| l.forward(&h).tanh());
    let want = run_backward(&plain.sum(Kind::Float), &ps);
    let got = run_backward(&m.forward(&x).sum(Kind::Float), &ps);
    assert!(got.iter().all(Tensor::defined));
    assert_all_equal("run_backward through model!", &want, &got);
}

#[test]
fn run_backward_through_checkpoint_sequential() {
    tch::manual_seed(5);
    let vs = nn::VarStore::new(Device::Cpu);
    let layers: Vec<nn::Linear> = (0..6).map(|i| linear(&vs, &format!("l{i}"))).collect();
    let x = x();
    let ps = params(&vs);
    let plain = layers.iter().fold(x.shallow_clone(), |h, l| l.forward(&h));
    let want = run_backward(&plain.tanh().sum(Kind::Float), &ps);
    let ys = ckpt::checkpoint_sequential(&layers, 3, &x);
    let got = run_backward(&ys.tanh().sum(Kind::Float), &ps);
    assert!(got.iter().all(Tensor::defined));
    assert_all_equal("run_backward through checkpoint_sequential", &want, &got);
}

/// A closure-built block (`nn::seq_t`) is opaque to `ckpt`; listing the `VarStore`'s
/// variables makes them inputs of the node.
#[test]
fn listed_variables_of_a_closure_built_block() {
    tch::manual_seed(6);
    let vs = nn::VarStore::new(Device::Cpu);
    let block = ckpt::Shared::new(
        nn::seq_t()
            .add(linear(&vs, "a"))
            .add_fn(|x| x.gelu("none"))
            .add(linear(&vs, "b")),
    );
    let x = x();
    let ps = params(&vs);
    let want = run_backward(&block.forward_t(&x, true).sum(Kind::Float), &ps);
    let unlisted = {
        let block = block.shallow_clone();
        checkpoint_with(
            &CheckpointOptions::new(),
            move |x: Tensor| block.forward_t(&x, true),
            x.shallow_clone(),
        )
    };
    // Unlisted and used only inside the segment: the gradient is undefined (documented).
    let got = run_backward(&unlisted.sum(Kind::Float), &ps);
    assert!(got.iter().all(|g| !g.defined()));
    let listed = {
        let block = block.shallow_clone();
        checkpoint_with(
            &CheckpointOptions::new().parameters(&vs.trainable_variables()),
            move |x: Tensor| block.forward_t(&x, true),
            x.shallow_clone(),
        )
    };
    let got = run_backward(&listed.sum(Kind::Float), &ps);
    assert_all_equal("listed variables", &want, &got);
}

/// A tensor captured unlisted and also used outside the segment: asking `run_backward`
/// for its gradient, with the segment's node on the way to another requested input, is
/// an error naming the segment (the gradient would miss the segment's part), not a
/// wrong value. (When nothing else requested lies behind the node, libtorch does not run
/// it and cannot know: documented on `CheckpointOptions::parameters`.)
#[test]
fn asking_for_an_unlisted_captured_tensor_is_an_error() {
    tch::manual_seed(7);
    let vs = nn::VarStore::new(Device::Cpu);
    let l = linear(&vs, "l");
    let x = x().set_requires_grad(true);
    let y = segment(
        &CheckpointOptions::new().name("unlisted"),
        &l,
        |h| h.tanh(),
        &x,
    );
    let loss = l.forward(&y).sum(Kind::Float);
    let err = Tensor::f_run_backward(&[&loss], &[&l.ws, &x], false, false)
        .expect_err("the segment's part of the gradient cannot be returned");
    let msg = err.to_string();
    assert!(msg.contains("checkpoint `unlisted`"), "{msg}");
    assert!(msg.contains("[6, 6] Float"), "{msg}");
    assert!(msg.contains("CheckpointOptions::parameters"), "{msg}");
    // Listed, the same request returns the plain gradients.
    let y = segment(
        &CheckpointOptions::new().parameters_of(&l),
        &l,
        |h| h.tanh(),
        &x,
    );
    let got = run_backward(
        &l.forward(&y).sum(Kind::Float),
        &[l.ws.shallow_clone(), x.shallow_clone()],
    );
    let plain = l.forward(&l.forward(&x).tanh()).sum(Kind::Float);
    let want = run_backward(&plain, &[l.ws.shallow_clone(), x.shallow_clone()]);
    assert_all_equal("listed", &want, &got);
}

/// A listed tensor that the segment does not use gets no gradient from it, and
/// parameters listed twice (or also passed as inputs) count once.
#[test]
fn unused_and_repeated_listings() {
    tch::manual_seed(8);
    let vs = nn::VarStore::new(Device::Cpu);
    let (a, unused) = (linear(&vs, "a"), linear(&vs, "unused"));
    let x = x();
    let want = run_backward(&a.forward(&x).sum(Kind::Float), std::slice::from_ref(&a.ws));
    let inner = a.shallow_clone();
    let opts = CheckpointOptions::new()
        .parameters_of(&a)
        .parameters_of(&a)
        .parameters_of(&unused);
    let y: Tensor = checkpoint_with(&opts, move |x: Tensor| inner.forward(&x), x.shallow_clone());
    let loss = y.sum(Kind::Float);
    let got = Tensor::run_backward(&[&loss], &[&a.ws, &unused.ws], true, false);
    assert_all_equal("listed twice", &want, &got[..1]);
    assert!(!got[1].defined(), "an unused listed weight has no gradient");
    // A weight passed as an input and listed: its gradient arrives once.
    let w = a.ws.shallow_clone();
    let y: Tensor = checkpoint_with(
        &CheckpointOptions::new().parameters(std::slice::from_ref(&w)),
        |(x, w): (Tensor, Tensor)| x.matmul(&w.tr()),
        (x.shallow_clone(), w.shallow_clone()),
    );
    let got = run_backward(&y.sum(Kind::Float), std::slice::from_ref(&w));
    let want = run_backward(
        &x.matmul(&w.tr()).sum(Kind::Float),
        std::slice::from_ref(&w),
    );
    assert_all_equal("input and listed", &want, &got);
}

/// Inside an autocast region, `run_backward` reaches a listed weight that autocast casts
/// (the recompute casts afresh instead of reusing a cast whose graph bypasses the node).
#[test]
fn run_backward_inside_an_autocast_region() {
    tch::manual_seed(9);
    let vs = nn::VarStore::new(Device::Cpu);
    let l = linear(&vs, "l");
    let x = x();
    let loss = |y: Tensor| y.to_kind(Kind::Float).sum(Kind::Float);
    let want = ckpt::amp::autocast(Device::Cpu, Kind::BFloat16, || {
        run_backward(&loss(l.forward(&x)), std::slice::from_ref(&l.ws))
    });
    let got = ckpt::amp::autocast(Device::Cpu, Kind::BFloat16, || {
        let y = segment(&CheckpointOptions::new().parameters_of(&l), &l, |h| h, &x);
        run_backward(&loss(y), std::slice::from_ref(&l.ws))
    });
    assert_all_equal("autocast, run_backward in the region", &want, &got);
}

/// A listed weight that is also an input of the segment, read both ways; and a segment
/// that returns a listed weight unchanged and a view of it.
#[test]
fn a_listed_parameter_as_an_input_and_as_an_output() {
    tch::manual_seed(10);
    let vs = nn::VarStore::new(Device::Cpu);
    let l = linear(&vs, "l");
    let x = x();
    let bs = l.bs.as_ref().unwrap().shallow_clone();
    let wrt = [bs.shallow_clone(), l.ws.shallow_clone()];
    let want = run_backward(&l.forward(&x.matmul(&l.ws.tr())).sum(Kind::Float), &wrt);
    let inner = l.shallow_clone();
    let y: Tensor = checkpoint_with(
        &CheckpointOptions::new().parameters_of(&l),
        move |(x, w): (Tensor, Tensor)| inner.forward(&x.matmul(&w.tr())),
        (x.shallow_clone(), l.ws.shallow_clone()),
    );
    let got = run_backward(&y.sum(Kind::Float), &wrt);
    assert_all_equal("input and captured", &want, &got);

    let head = |y: &Tensor, w: &Tensor, v: &Tensor| {
        y.sum(Kind::Float) + w.square().sum(Kind::Float) + v.sum(Kind::Float)
    };
    let want = run_backward(
        &head(&l.forward(&x), &l.ws, &l.ws.narrow(0, 0, 2)),
        std::slice::from_ref(&l.ws),
    );
    let inner = l.shallow_clone();
    let (y, w, v): (Tensor, Tensor, Tensor) = checkpoint_with(
        &CheckpointOptions::new().parameters_of(&l),
        move |x: Tensor| {
            (
                inner.forward(&x),
                inner.ws.shallow_clone(),
                inner.ws.narrow(0, 0, 2),
            )
        },
        x.shallow_clone(),
    );
    let got = run_backward(&head(&y, &w, &v), std::slice::from_ref(&l.ws));
    assert_all_equal("returned unchanged and as a view", &want, &got);
}

/// Closure-built blocks in `Shared`, their variables listed with `with_parameters`:
/// `checkpoint_sequential_t` makes them inputs of its nodes.
#[test]
fn shared_closure_built_blocks_with_their_parameters() {
    tch::manual_seed(11);
    let vs = nn::VarStore::new(Device::Cpu);
    let blocks: Vec<ckpt::Shared<nn::SequentialT>> = (0..4)
        .map(|i| {
            let p = vs.root() / format!("b{i}");
            let block = nn::seq_t()
                .add(nn::linear(&p / "fc", D, D, Default::default()))
                .add_fn(|x| x.tanh());
            let vars: Vec<Tensor> = vs
                .variables()
                .into_iter()
                .filter(|(name, _)| name.starts_with(&format!("b{i}.")))
                .map(|(_, t)| t)
                .collect();
            ckpt::Shared::new(block).with_parameters(&vars)
        })
        .collect();
    let x = x();
    let ps = params(&vs);
    let plain = blocks
        .iter()
        .fold(x.shallow_clone(), |h, b| b.forward_t(&h, true));
    let want = run_backward(&plain.sum(Kind::Float), &ps);
    let ys = ckpt::checkpoint_sequential_t(&blocks, 3, &x, true);
    let got = run_backward(&ys.sum(Kind::Float), &ps);
    assert!(got.iter().all(Tensor::defined), "a gradient is undefined");
    assert_all_equal("Shared blocks with_parameters", &want, &got);
}

//! Batch norm's running statistics are updated once per training step, checkpointed or
//! not (issue 11, item 1): a checkpointed segment runs its batch norms twice (forward and
//! recompute) and the planner's profiling runs them again, yet after any number of SGD
//! steps every buffer equals the plain model's bit for bit, as do outputs, gradients and
//! parameters. Through every route: a ResNet-18 built as `tch::vision::resnet` builds it
//! (closure-built blocks, `nn::func_t` in `nn::seq_t`) with its layer groups checkpointed
//! through `ckpt::checkpoint` on a `ckpt::Shared` module; `#[checkpointed]`; `model!`;
//! `checkpoint_sequential_t`; `segments = auto` in `model!` and in `#[checkpointed]`;
//! `SequentialPlanner` (whose first call profiles).

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use ckpt::{ShallowClone, Shared, checkpointed};
use ckpt_models::resnet::ResNet18;
use tch::nn::{self, ModuleT, OptimizerConfig};
use tch::{Device, Kind, Tensor};

/// The RNG and the plan caches are process-wide: the tests of this file take turns.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a run of training steps produced, step by step.
struct Trace {
    outputs: Vec<Tensor>,
    /// Per step, the gradient of every trainable variable, by name.
    grads: Vec<BTreeMap<String, Tensor>>,
}

/// `inputs.len()` SGD steps (momentum 0.9) with the loss `mean(y²)`.
fn train(vs: &nn::VarStore, inputs: &[Tensor], forward: &dyn Fn(&Tensor) -> Tensor) -> Trace {
    let mut opt = nn::Sgd {
        momentum: 0.9,
        ..Default::default()
    }
    .build(vs, 0.05)
    .unwrap();
    let mut trace = Trace {
        outputs: Vec::new(),
        grads: Vec::new(),
    };
    for x in inputs {
        let y = forward(x);
        let loss = (&y * &y).mean(Kind::Float);
        opt.zero_grad();
        loss.backward();
        trace.outputs.push(y.detach().copy());
        trace.grads.push(
            vs.variables()
                .into_iter()
                .filter(|(_, v)| v.requires_grad())
                .map(|(k, v)| (k, v.grad().copy()))
                .collect(),
        );
        opt.step();
    }
    trace
}

fn assert_same_trace(what: &str, plain: &Trace, ckpt: &Trace) {
    for (s, (a, b)) in plain.outputs.iter().zip(&ckpt.outputs).enumerate() {
        assert!(a.equal(b), "{what}: output of step {s}");
    }
    for (s, (a, b)) in plain.grads.iter().zip(&ckpt.grads).enumerate() {
        assert_eq!(a.len(), b.len());
        for ((name, ga), gb) in a.iter().zip(b.values()) {
            assert!(ga.equal(gb), "{what}: gradient of {name} at step {s}");
        }
    }
}

/// Every variable (parameters and buffers) equal bit for bit; returns the number of
/// buffers (variables that do not require grad).
fn assert_same_variables(what: &str, plain: &nn::VarStore, ckpt: &nn::VarStore) -> usize {
    let (a, b) = (plain.variables(), ckpt.variables());
    assert_eq!(a.len(), b.len());
    let mut buffers = 0;
    for (name, va) in &a {
        let vb = &b[name];
        assert!(va.equal(vb), "{what}: variable {name} differs");
        if !va.requires_grad() {
            buffers += 1;
            if name.ends_with("running_mean") {
                assert!(
                    va.abs().sum(Kind::Float).double_value(&[]) > 0.0,
                    "{what}: {name} was updated"
                );
            }
        }
    }
    buffers
}

fn inputs(shape: &[i64], steps: usize) -> Vec<Tensor> {
    (0..steps)
        .map(|_| Tensor::randn(shape, (Kind::Float, Device::Cpu)))
        .collect()
}

/// A VarStore holding a copy of `vs`'s variables, for a second model built the same way.
fn copy_into(target: &mut nn::VarStore, source: &nn::VarStore) {
    target.copy(source).unwrap();
}

#[test]
fn resnet18_with_checkpointed_layer_groups_trains_as_the_plain_model() {
    let _serial = serial();
    tch::manual_seed(11);
    let vs_plain = nn::VarStore::new(Device::Cpu);
    let plain = ResNet18::new(&vs_plain.root(), 10);
    let mut vs_ckpt = nn::VarStore::new(Device::Cpu);
    let ckpt = ResNet18::new(&vs_ckpt.root(), 10);
    copy_into(&mut vs_ckpt, &vs_plain);
    let mut vs_start = nn::VarStore::new(Device::Cpu);
    let _start = ResNet18::new(&vs_start.root(), 10);
    copy_into(&mut vs_start, &vs_plain);
    let xs = inputs(&[2, 3, 32, 32], 3);

    let want = train(&vs_plain, &xs, &|x| plain.forward_t(x, true, false));
    let got = train(&vs_ckpt, &xs, &|x| ckpt.forward_t(x, true, true));
    assert_same_trace("resnet18", &want, &got);
    let buffers = assert_same_variables("resnet18", &vs_plain, &vs_ckpt);
    assert_eq!(
        buffers, 40,
        "20 batch norms, running_mean and running_var each"
    );

    // What the test guards against: a model whose batch norms run twice per step (an
    // extra no-grad forward in training mode, as a recompute that updated them would be)
    // ends with other statistics, which the comparison above would have caught.
    let mut vs_twice = nn::VarStore::new(Device::Cpu);
    let twice = ResNet18::new(&vs_twice.root(), 10);
    copy_into(&mut vs_twice, &vs_start);
    train(&vs_twice, &xs, &|x| {
        tch::no_grad(|| drop(twice.forward_t(x, true, false)));
        twice.forward_t(x, true, false)
    });
    let twice_vars = vs_twice.variables();
    let differ: Vec<bool> = vs_plain
        .variables()
        .iter()
        .filter(|(_, v)| !v.requires_grad())
        .map(|(name, v)| !v.equal(&twice_vars[name]))
        .collect();
    assert_eq!(differ.len(), 40);
    assert!(
        differ.iter().all(|&d| d),
        "every buffer differs after double updates"
    );

    // The statistics serve evaluation: the same outputs in eval mode.
    let x = Tensor::randn([2, 3, 32, 32], (Kind::Float, Device::Cpu));
    let eval_plain = tch::no_grad(|| plain.forward_t(&x, false, false));
    let eval_ckpt = ckpt.forward_t(&x, false, true);
    assert!(eval_plain.equal(&eval_ckpt.detach()));
}

// ---------------------------------------------------------------------------------------
// Small conv + batch norm blocks, through the other routes.

const C: i64 = 4;
const BLOCKS: usize = 4;

#[derive(Debug, ShallowClone)]
struct Block {
    conv: nn::Conv2D,
    bn: nn::BatchNorm,
}

impl Block {
    fn new(p: nn::Path, c: i64) -> Self {
        let cfg = nn::ConvConfig {
            padding: 1,
            ..Default::default()
        };
        Block {
            conv: nn::conv2d(&p / "conv", c, c, 3, cfg),
            bn: nn::batch_norm2d(&p / "bn", c, Default::default()),
        }
    }

    /// The whole block as one segment.
    #[checkpointed]
    fn forward_ckpt(&self, xs: &Tensor, train: bool) -> Tensor {
        xs.apply(&self.conv).apply_t(&self.bn, train).relu() + xs
    }
}

impl ModuleT for Block {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        xs.apply(&self.conv).apply_t(&self.bn, train).relu() + xs
    }
}

#[derive(Debug, ShallowClone)]
struct Blocks {
    blocks: Vec<Block>,
}

impl Blocks {
    fn new(p: nn::Path) -> Self {
        Blocks {
            blocks: (0..BLOCKS)
                .map(|i| Block::new(&p / "blocks" / i, C))
                .collect(),
        }
    }

    fn plain(&self, xs: &Tensor, train: bool) -> Tensor {
        let mut xs = xs.shallow_clone();
        for block in self.blocks.iter() {
            xs = block.forward_t(&xs, train);
        }
        xs
    }

    /// `#[checkpointed]` on each block's forward.
    fn per_block(&self, xs: &Tensor, train: bool) -> Tensor {
        let mut xs = xs.shallow_clone();
        for block in self.blocks.iter() {
            xs = block.forward_ckpt(&xs, train);
        }
        xs
    }

    /// The loop cut by the planner: profiled on the first training call.
    #[checkpointed(segments = auto)]
    fn auto(&self, xs: &Tensor, train: bool) -> Tensor {
        let mut xs = xs.shallow_clone();
        for block in self.blocks.iter() {
            xs = block.forward_t(&xs, train);
        }
        xs
    }
}

ckpt::model! {
    struct PlainModel(p, c: i64, n: usize) {
        #[train] blocks: [Block; n] = Block::new(p, c),
    }
}

ckpt::model! {
    #[checkpointed(segments = 2)]
    struct TwoSegments(p, c: i64, n: usize) {
        #[train] blocks: [Block; n] = Block::new(p, c),
    }
}

ckpt::model! {
    #[checkpointed(segments = auto)]
    struct AutoModel(p, c: i64, n: usize) {
        #[train] blocks: [Block; n] = Block::new(p, c),
    }
}

/// Trains `forward` over a copy of the plain blocks and checks everything against the
/// plain run.
fn check_blocks_route(what: &str, forward: &dyn Fn(&Blocks, &Tensor) -> Tensor) {
    tch::manual_seed(3);
    let vs_plain = nn::VarStore::new(Device::Cpu);
    let plain = Blocks::new(vs_plain.root());
    let mut vs_ckpt = nn::VarStore::new(Device::Cpu);
    let ckpt = Blocks::new(vs_ckpt.root());
    copy_into(&mut vs_ckpt, &vs_plain);
    let xs = inputs(&[3, C, 6, 6], 3);
    let want = train(&vs_plain, &xs, &|x| plain.plain(x, true));
    let got = train(&vs_ckpt, &xs, &|x| forward(&ckpt, x));
    assert_same_trace(what, &want, &got);
    assert_eq!(assert_same_variables(what, &vs_plain, &vs_ckpt), 2 * BLOCKS);
}

#[test]
fn checkpointed_blocks_update_running_statistics_once() {
    let _serial = serial();
    check_blocks_route("#[checkpointed]", &|m, x| m.per_block(x, true));
}

#[test]
fn checkpoint_sequential_t_updates_running_statistics_once() {
    let _serial = serial();
    for segments in [2, 4] {
        check_blocks_route("checkpoint_sequential_t", &|m, x| {
            ckpt::checkpoint_sequential_t(&m.blocks, segments, x, true)
        });
    }
}

#[test]
fn checkpoint_on_a_shared_module_updates_running_statistics_once() {
    let _serial = serial();
    check_blocks_route("checkpoint of Shared", &|m, x| {
        let shared = Shared::new(m.shallow_clone());
        ckpt::checkpoint(
            move |x: Tensor| shared.lock().plain(&x, true),
            x.shallow_clone(),
        )
    });
}

/// The profiling runs of `segments = auto` (several forwards of each stage) leave the
/// statistics alone: the first call updates them once, as a plain call does.
#[test]
fn segments_auto_profiling_does_not_touch_running_statistics() {
    let _serial = serial();
    check_blocks_route("#[checkpointed(segments = auto)]", &|m, x| m.auto(x, true));
}

/// `SequentialPlanner` profiles the chain on its first call, then runs the plan.
#[test]
fn sequential_planner_profiling_does_not_touch_running_statistics() {
    let _serial = serial();
    let planner = std::cell::RefCell::new(ckpt::plan::SequentialPlanner::new(
        ckpt::plan::Objective::MinPeak,
    ));
    check_blocks_route("SequentialPlanner", &|m, x| {
        planner.borrow_mut().forward_t(&m.blocks, x, true)
    });
    assert!(
        planner
            .borrow()
            .plan_for(
                &Tensor::zeros([3, C, 6, 6], (Kind::Float, Device::Cpu)),
                Some(true)
            )
            .is_some()
    );
}

#[test]
fn model_macro_updates_running_statistics_once() {
    let _serial = serial();
    tch::manual_seed(4);
    let vs_plain = nn::VarStore::new(Device::Cpu);
    let plain = PlainModel::new(vs_plain.root(), C, BLOCKS);
    let xs = inputs(&[3, C, 6, 6], 3);
    let want = train(&vs_plain, &xs, &|x| plain.forward_t(x, true));

    let mut vs_two = nn::VarStore::new(Device::Cpu);
    let two = TwoSegments::new(vs_two.root(), C, BLOCKS);
    let mut vs_auto = nn::VarStore::new(Device::Cpu);
    let auto = AutoModel::new(vs_auto.root(), C, BLOCKS);
    // The start of the plain run: a fresh plain model with the same seed.
    tch::manual_seed(4);
    let vs_start = nn::VarStore::new(Device::Cpu);
    let _start = PlainModel::new(vs_start.root(), C, BLOCKS);
    copy_into(&mut vs_two, &vs_start);
    copy_into(&mut vs_auto, &vs_start);

    let got = train(&vs_two, &xs, &|x| two.forward_t(x, true));
    assert_same_trace("model! segments = 2", &want, &got);
    assert_eq!(
        assert_same_variables("model!", &vs_plain, &vs_two),
        2 * BLOCKS
    );
    let got = train(&vs_auto, &xs, &|x| auto.forward_t(x, true));
    assert_same_trace("model! segments = auto", &want, &got);
    assert_eq!(
        assert_same_variables("model! auto", &vs_plain, &vs_auto),
        2 * BLOCKS
    );
}

/// `Tensor::instance_norm` with running statistics (`use_input_stats`) is covered too.
#[test]
fn instance_norm_running_statistics_are_updated_once() {
    let _serial = serial();
    let mean = Tensor::zeros([C], (Kind::Float, Device::Cpu));
    let var = Tensor::ones([C], (Kind::Float, Device::Cpu));
    let (mean2, var2) = (mean.copy(), var.copy());
    let x = Tensor::randn([2, C, 5], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let norm = |x: &Tensor, m: &Tensor, v: &Tensor| {
        Tensor::instance_norm(
            x,
            None::<&Tensor>,
            None,
            Some(m),
            Some(v),
            true,
            0.1,
            1e-5,
            false,
        )
    };
    let y = norm(&x, &mean, &var);
    y.square().sum(Kind::Float).backward();
    let want_grad = x.grad().copy();
    let _ = x.grad().zero_();
    let (m, v) = (mean2.shallow_clone(), var2.shallow_clone());
    let y2: Tensor = ckpt::checkpoint(move |x: Tensor| norm(&x, &m, &v), x.shallow_clone());
    y2.square().sum(Kind::Float).backward();
    assert!(y.equal(&y2));
    assert!(x.grad().equal(&want_grad));
    assert!(mean.equal(&mean2) && var.equal(&var2));
    assert!(mean.abs().sum(Kind::Float).double_value(&[]) > 0.0);
}

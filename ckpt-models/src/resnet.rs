//! ResNet-18 as `tch::vision::resnet` builds it: blocks are closures (`nn::func_t`), a
//! layer group is an `nn::seq_t` of them; the four groups are what the tests and
//! examples checkpoint (each a segment through a [`Shared`] module).

use ckpt::{CheckpointOptions, ShallowClone, Shared};
use tch::Tensor;
use tch::nn::{self, ModuleT};

/// A convolution without bias (`ksize`, `padding`, `stride` in pixels).
pub fn conv2d(
    p: nn::Path,
    c_in: i64,
    c_out: i64,
    ksize: i64,
    padding: i64,
    stride: i64,
) -> nn::Conv2D {
    let cfg = nn::ConvConfig {
        stride,
        padding,
        bias: false,
        ..Default::default()
    };
    nn::conv2d(p, c_in, c_out, ksize, cfg)
}

/// The shortcut of a block: a strided 1×1 convolution and batch norm when the shape
/// changes, else the identity.
pub fn downsample(p: nn::Path, c_in: i64, c_out: i64, stride: i64) -> impl ModuleT + use<> {
    if stride != 1 || c_in != c_out {
        nn::seq_t()
            .add(conv2d(&p / "0", c_in, c_out, 1, 0, stride))
            .add(nn::batch_norm2d(&p / "1", c_out, Default::default()))
    } else {
        nn::seq_t()
    }
}

/// ResNet's basic block: two 3×3 convolutions with batch norm, and the shortcut.
pub fn basic_block(p: nn::Path, c_in: i64, c_out: i64, stride: i64) -> impl ModuleT + use<> {
    let conv1 = conv2d(&p / "conv1", c_in, c_out, 3, 1, stride);
    let bn1 = nn::batch_norm2d(&p / "bn1", c_out, Default::default());
    let conv2 = conv2d(&p / "conv2", c_out, c_out, 3, 1, 1);
    let bn2 = nn::batch_norm2d(&p / "bn2", c_out, Default::default());
    let downsample = downsample(&p / "downsample", c_in, c_out, stride);
    nn::func_t(move |xs, train| {
        let ys = xs
            .apply(&conv1)
            .apply_t(&bn1, train)
            .relu()
            .apply(&conv2)
            .apply_t(&bn2, train);
        (xs.apply_t(&downsample, train) + ys).relu()
    })
}

/// A layer group of `cnt` basic blocks, the first with `stride`.
pub fn basic_layer(p: nn::Path, c_in: i64, c_out: i64, stride: i64, cnt: i64) -> nn::SequentialT {
    let mut layer = nn::seq_t().add(basic_block(&p / "0", c_in, c_out, stride));
    for block_index in 1..cnt {
        layer = layer.add(basic_block(&p / block_index, c_out, c_out, 1))
    }
    layer
}

/// ResNet-18 with `nclasses` outputs; its layer groups are [`Shared`].
pub struct ResNet18 {
    conv1: nn::Conv2D,
    bn1: nn::BatchNorm,
    layers: Vec<Shared<nn::SequentialT>>,
    fc: nn::Linear,
}

impl ResNet18 {
    /// The model under `p`, with `nclasses` outputs.
    pub fn new(p: &nn::Path, nclasses: i64) -> Self {
        ResNet18 {
            conv1: conv2d(p / "conv1", 3, 64, 7, 3, 2),
            bn1: nn::batch_norm2d(p / "bn1", 64, Default::default()),
            layers: vec![
                Shared::new(basic_layer(p / "layer1", 64, 64, 1, 2)),
                Shared::new(basic_layer(p / "layer2", 64, 128, 2, 2)),
                Shared::new(basic_layer(p / "layer3", 128, 256, 2, 2)),
                Shared::new(basic_layer(p / "layer4", 256, 512, 2, 2)),
            ],
            fc: nn::linear(p / "fc", 512, nclasses, Default::default()),
        }
    }

    /// tch's forward (`xs`: `[batch, 3, height, width]`, returns `[batch, nclasses]`);
    /// with `checkpointed`, each layer group is a checkpointed segment.
    pub fn forward_t(&self, xs: &Tensor, train: bool, checkpointed: bool) -> Tensor {
        self.forward_listing(xs, train, checkpointed, &[])
    }

    /// [`ResNet18::forward_t`] with each checkpointed layer group listing `params`
    /// ([`CheckpointOptions::parameters`]).
    pub fn forward_listing(
        &self,
        xs: &Tensor,
        train: bool,
        checkpointed: bool,
        params: &[Tensor],
    ) -> Tensor {
        let mut xs = xs
            .apply(&self.conv1)
            .apply_t(&self.bn1, train)
            .relu()
            .max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], false);
        for layer in &self.layers {
            xs = if checkpointed {
                let layer = layer.shallow_clone();
                let options = CheckpointOptions::new().parameters(params);
                ckpt::checkpoint_with(
                    &options,
                    move |x: Tensor| layer.lock().forward_t(&x, train),
                    xs,
                )
            } else {
                layer.lock().forward_t(&xs, train)
            };
        }
        xs.adaptive_avg_pool2d([1, 1]).flat_view().apply(&self.fc)
    }
}

//! [`ShallowClone`] for tch's `nn` layers (`Linear`, the convolutions, the norms,
//! `Embedding`, the recurrent layers and their states): each copy shares the layer's
//! tensors, and the layers whose fields tch keeps private are rebuilt from their parts.

use std::mem::ManuallyDrop;

use tch::nn;
use tch::{Device, Tensor};

use super::ShallowClone;

/// `visit_tensors` of a layer: the listed tensor fields, `Option`s included.
macro_rules! visit_fields {
    ($($field:ident),+) => {
        fn visit_tensors(&self, f: &mut dyn FnMut(&Tensor)) {
            $(ShallowClone::visit_tensors(&self.$field, f);)+
        }
    };
}

impl ShallowClone for nn::Linear {
    fn shallow_clone(&self) -> Self {
        nn::Linear {
            ws: self.ws.shallow_clone(),
            bs: self.bs.shallow_clone(),
        }
    }

    visit_fields!(ws, bs);
}

impl ShallowClone for nn::LSTMState {
    fn shallow_clone(&self) -> Self {
        nn::LSTMState(self.0.shallow_clone())
    }

    fn visit_tensors(&self, f: &mut dyn FnMut(&Tensor)) {
        self.0.visit_tensors(f);
    }
}

impl ShallowClone for nn::GRUState {
    fn shallow_clone(&self) -> Self {
        nn::GRUState(self.0.shallow_clone())
    }

    fn visit_tensors(&self, f: &mut dyn FnMut(&Tensor)) {
        self.0.visit_tensors(f);
    }
}

/// Bitwise copy of `orig` whose non-`Copy` public fields `fix` then overwrites (with
/// `std::ptr::write`, so the aliased originals are not dropped).
///
/// # Safety
///
/// Every field of `T` that `fix` does not overwrite must be of a `Copy` type (no heap, no
/// `Drop`), so that the bitwise copy of it is an independent value.
unsafe fn copy_then_fix<T>(orig: &T, fix: impl FnOnce(&mut T)) -> T {
    // SAFETY: the copy aliases `orig`'s non-Copy fields until `fix` replaces them; it is
    // kept in `ManuallyDrop` until then, so if `fix` panics it leaks instead of freeing
    // what `orig` still owns.
    let mut copy = ManuallyDrop::new(unsafe { std::ptr::read(orig) });
    fix(&mut copy);
    ManuallyDrop::into_inner(copy)
}

// The layers below have exactly one private field, `config`, of a public `Copy` type
// (checked against tch 0.26.0, which the workspace pins with `=`): the assertions make
// the `Copy` part a compile-time fact.
const _: fn() = || {
    fn copy<T: Copy>() {}
    copy::<nn::LayerNormConfig>();
    copy::<nn::GroupNormConfig>();
    copy::<nn::BatchNormConfig>();
    copy::<nn::EmbeddingConfig>();
    copy::<nn::ConvTransposeConfigND<[i64; 1]>>();
    copy::<nn::ConvTransposeConfigND<[i64; 2]>>();
    copy::<nn::ConvTransposeConfigND<[i64; 3]>>();
};

impl ShallowClone for nn::LayerNorm {
    fn shallow_clone(&self) -> Self {
        // SAFETY: `LayerNorm { config: LayerNormConfig (Copy, private), ws, bs,
        // normalized_shape }`: every non-Copy field is overwritten below.
        unsafe {
            copy_then_fix(self, |c| {
                std::ptr::write(&mut c.ws, self.ws.shallow_clone());
                std::ptr::write(&mut c.bs, self.bs.shallow_clone());
                std::ptr::write(&mut c.normalized_shape, self.normalized_shape.clone());
            })
        }
    }

    visit_fields!(ws, bs);
}

impl ShallowClone for nn::GroupNorm {
    fn shallow_clone(&self) -> Self {
        // SAFETY: `GroupNorm { config: GroupNormConfig (Copy, private), ws, bs,
        // num_groups, num_channels }`: `ws` and `bs` are overwritten, the rest is Copy.
        unsafe {
            copy_then_fix(self, |c| {
                std::ptr::write(&mut c.ws, self.ws.shallow_clone());
                std::ptr::write(&mut c.bs, self.bs.shallow_clone());
            })
        }
    }

    visit_fields!(ws, bs);
}

impl ShallowClone for nn::BatchNorm {
    fn shallow_clone(&self) -> Self {
        // SAFETY: `BatchNorm { config: BatchNormConfig (Copy, private), running_mean,
        // running_var, ws, bs, nd }`: the tensors are overwritten, `nd` is Copy. The
        // running statistics are shared, as the module's own state is.
        unsafe {
            copy_then_fix(self, |c| {
                std::ptr::write(&mut c.running_mean, self.running_mean.shallow_clone());
                std::ptr::write(&mut c.running_var, self.running_var.shallow_clone());
                std::ptr::write(&mut c.ws, self.ws.shallow_clone());
                std::ptr::write(&mut c.bs, self.bs.shallow_clone());
            })
        }
    }

    visit_fields!(ws, bs, running_mean, running_var);
}

impl ShallowClone for nn::Embedding {
    fn shallow_clone(&self) -> Self {
        // SAFETY: `Embedding { ws, config: EmbeddingConfig (Copy, private) }`.
        unsafe {
            copy_then_fix(self, |c| {
                std::ptr::write(&mut c.ws, self.ws.shallow_clone())
            })
        }
    }

    visit_fields!(ws);
}

impl<ND: Copy> ShallowClone for nn::ConvTransposeND<ND> {
    fn shallow_clone(&self) -> Self {
        // SAFETY: `ConvTransposeND { ws, bs, config: ConvTransposeConfigND<ND> (private) }`
        // with `ND: Copy`, which makes the config `Copy` (it derives `Clone, Copy`).
        unsafe {
            copy_then_fix(self, |c| {
                std::ptr::write(&mut c.ws, self.ws.shallow_clone());
                std::ptr::write(&mut c.bs, self.bs.shallow_clone());
            })
        }
    }

    visit_fields!(ws, bs);
}

/// `nn::Conv` keeps a private `Vec` next to its private config, so a bitwise copy would
/// alias it. The clone is rebuilt through tch's own constructor instead, on a throwaway
/// `VarStore` with empty weights, from the configuration that `Conv`'s `Debug` output
/// shows; then its weights are pointed at the original's.
trait ConvDims: Copy + AsRef<[i64]> + for<'a> TryFrom<&'a [i64]> {}
impl ConvDims for [i64; 1] {}
impl ConvDims for [i64; 2] {}
impl ConvDims for [i64; 3] {}

impl<ND: ConvDims + std::fmt::Debug> ShallowClone for nn::Conv<ND> {
    fn shallow_clone(&self) -> Self {
        let text = format!("{self:?}");
        let config = conv_config::<ND>(&text, self.bs.is_some())
            .unwrap_or_else(|| panic!("ckpt: cannot read the configuration of {text}"));
        let ksizes: ND = self.ws.size()[2..].try_into().unwrap_or_else(|_| {
            panic!(
                "ckpt: unexpected convolution weight shape {:?}",
                self.ws.size()
            )
        });
        let throwaway = nn::VarStore::new(Device::Cpu);
        let groups = config.groups;
        let mut conv = nn::conv(throwaway.root(), groups, 0, ksizes, config);
        conv.ws = self.ws.shallow_clone();
        conv.bs = self.bs.shallow_clone();
        conv
    }

    visit_fields!(ws, bs);
}

fn conv_config<ND: ConvDims>(debug: &str, bias: bool) -> Option<nn::ConvConfigND<ND>> {
    let config = &debug[debug.rfind("config: ")?..];
    let dims = |key: &str| -> Option<ND> {
        let v: Vec<i64> = field(config, key)?
            .trim_matches(|c| c == '[' || c == ']')
            .split(',')
            .map(|s| s.trim().parse().ok())
            .collect::<Option<_>>()?;
        ND::try_from(v.as_slice()).ok()
    };
    let padding_mode = match field(config, "padding_mode")? {
        "Zeros" => nn::PaddingMode::Zeros,
        "Reflect" => nn::PaddingMode::Reflect,
        "Replicate" => nn::PaddingMode::Replicate,
        "Circular" => nn::PaddingMode::Circular,
        _ => return None,
    };
    Some(nn::ConvConfigND {
        stride: dims("stride")?,
        padding: dims("padding")?,
        dilation: dims("dilation")?,
        groups: field(config, "groups")?.parse().ok()?,
        bias,
        ws_init: nn::Init::Const(0.),
        bs_init: nn::Init::Const(0.),
        padding_mode,
    })
}

/// The value of `key: value` at the top level of a `Name { .. }` Debug rendering.
fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let mut depth = 0i32;
    let bytes = text.as_bytes();
    let needle = format!("{key}: ");
    let mut i = 0;
    let mut start = None;
    while i < bytes.len() {
        match bytes[i] {
            b'{' | b'[' | b'(' => depth += 1,
            b'}' | b']' | b')' => depth -= 1,
            _ => {}
        }
        if depth == 1 && start.is_none() && text[i..].starts_with(&needle) {
            let preceded = i > 0 && matches!(bytes[i - 1], b' ' | b'{');
            if preceded {
                start = Some(i + needle.len());
                i += needle.len();
                continue;
            }
        }
        if let Some(s) = start
            && ((depth == 1 && bytes[i] == b',') || depth == 0)
        {
            return Some(text[s..i].trim());
        }
        i += 1;
    }
    None
}

/// The fields of tch 0.26.0's `nn::GRU` and `nn::LSTM`, in their order and of their types
/// (both are `{ flat_weights: Vec<Tensor>, hidden_dim: i64, config: RNNConfig, device:
/// Device }`, all private). tch offers neither `Clone` nor access to the weights, so the
/// shallow clone reads the layer through this mirror. Two structs with the same field
/// types in the same order get the same layout from rustc, but the language does not
/// promise it: `transmute` checks the sizes at compile time, and [`rnn_layout_checked`]
/// checks every field at run time on a probe layer built with distinctive values before
/// the first clone, panicking (never reading a wrong layout) if they disagree.
struct RnnFields {
    flat_weights: Vec<Tensor>,
    hidden_dim: i64,
    config: nn::RNNConfig,
    device: Device,
}

const _: fn() = || {
    // Same size (also checked by `transmute` below) and alignment.
    let _ = std::mem::transmute::<RnnFields, nn::GRU>;
    let _ = std::mem::transmute::<RnnFields, nn::LSTM>;
    assert!(std::mem::align_of::<RnnFields>() == std::mem::align_of::<nn::GRU>());
    assert!(std::mem::align_of::<RnnFields>() == std::mem::align_of::<nn::LSTM>());
};

/// Whether [`RnnFields`] reads a GRU and an LSTM as tch built them: probe layers with a
/// distinctive hidden size, layer count, dropout and flags (on a throwaway `VarStore`)
/// are read through the mirror, and every field must come out as built, the weights with
/// the shapes tch gives them (`[gates * hidden, in]` then `[gates * hidden, hidden]`,
/// then the biases, per layer and direction).
fn rnn_layout_checked() -> bool {
    static CHECKED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CHECKED.get_or_init(|| {
        let vs = nn::VarStore::new(Device::Cpu);
        let config = nn::RNNConfig {
            has_biases: true,
            num_layers: 3,
            dropout: 0.375,
            train: false,
            bidirectional: true,
            batch_first: false,
            ..Default::default()
        };
        let (input, hidden) = (5, 7);
        let check = |fields: &RnnFields, gates: i64| {
            let c = &fields.config;
            fields.hidden_dim == hidden
                && c.has_biases
                && c.num_layers == 3
                && c.dropout == 0.375
                && !c.train
                && c.bidirectional
                && !c.batch_first
                && fields.device == Device::Cpu
                && fields.flat_weights.len() == 3 * 2 * 4
                && fields.flat_weights[0].size() == [gates * hidden, input]
                && fields.flat_weights[1].size() == [gates * hidden, hidden]
                && fields.flat_weights[2].size() == [gates * hidden]
        };
        let gru = nn::gru(vs.root() / "gru", input, hidden, config);
        let lstm = nn::lstm(vs.root() / "lstm", input, hidden, config);
        // SAFETY: the sizes and alignments are equal (checked at compile time); the
        // scalar fields are read first and the vector only when they all match, i.e.
        // when the mirror's offsets are the layer's.
        let scalars_ok = |f: *const RnnFields| unsafe {
            let f = &*f;
            f.hidden_dim == hidden && f.config.num_layers == 3 && f.config.dropout == 0.375
        };
        let gru_fields = (&gru as *const nn::GRU).cast::<RnnFields>();
        let lstm_fields = (&lstm as *const nn::LSTM).cast::<RnnFields>();
        if !(scalars_ok(gru_fields) && scalars_ok(lstm_fields)) {
            return false;
        }
        // SAFETY: as above, the scalars matched.
        let (gru_fields, lstm_fields) = unsafe { (&*gru_fields, &*lstm_fields) };
        check(gru_fields, 3) && check(lstm_fields, 4)
    })
}

/// The fields of a GRU or LSTM, read through [`RnnFields`].
///
/// # Safety
///
/// `R` must be `nn::GRU` or `nn::LSTM`.
unsafe fn rnn_fields<R>(orig: &R) -> &RnnFields {
    assert!(
        rnn_layout_checked(),
        "ckpt: the layout of tch's nn::GRU / nn::LSTM is not the one ckpt was written for (tch 0.26.0); wrap the layer in ckpt::Shared"
    );
    // SAFETY: `R` is a GRU or an LSTM, whose layout the mirror's was checked to be.
    unsafe { &*(orig as *const R).cast::<RnnFields>() }
}

/// The shallow clone of a GRU or LSTM read through [`RnnFields`].
///
/// # Safety
///
/// `R` must be `nn::GRU` or `nn::LSTM`.
unsafe fn rnn_shallow_clone<R>(orig: &R, to_r: fn(RnnFields) -> R) -> R {
    // SAFETY: as this function's contract.
    let fields = unsafe { rnn_fields(orig) };
    to_r(RnnFields {
        flat_weights: fields
            .flat_weights
            .iter()
            .map(Tensor::shallow_clone)
            .collect(),
        hidden_dim: fields.hidden_dim,
        config: fields.config,
        device: fields.device,
    })
}

impl ShallowClone for nn::GRU {
    /// Shares the weights (same tensors, same autograd identity), read through a mirror of
    /// tch 0.26.0's private fields whose layout is checked at compile and run time.
    fn shallow_clone(&self) -> Self {
        // SAFETY: `Self` is `nn::GRU`; the transmute is of the mirror checked above.
        unsafe { rnn_shallow_clone(self, |f| std::mem::transmute::<RnnFields, nn::GRU>(f)) }
    }

    fn visit_tensors(&self, f: &mut dyn FnMut(&Tensor)) {
        // SAFETY: `Self` is `nn::GRU`.
        unsafe { rnn_fields(self) }.flat_weights.iter().for_each(f);
    }
}

impl ShallowClone for nn::LSTM {
    /// Shares the weights (same tensors, same autograd identity), read through a mirror of
    /// tch 0.26.0's private fields whose layout is checked at compile and run time.
    fn shallow_clone(&self) -> Self {
        // SAFETY: `Self` is `nn::LSTM`; the transmute is of the mirror checked above.
        unsafe { rnn_shallow_clone(self, |f| std::mem::transmute::<RnnFields, nn::LSTM>(f)) }
    }

    fn visit_tensors(&self, f: &mut dyn FnMut(&Tensor)) {
        // SAFETY: `Self` is `nn::LSTM`.
        unsafe { rnn_fields(self) }.flat_weights.iter().for_each(f);
    }
}

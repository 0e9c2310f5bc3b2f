//! `#[derive(ShallowClone)]` on structs (named, tuple, unit, generic) and enums.
use ckpt::ShallowClone;
use tch::{nn, Device, Kind, Tensor};

#[derive(Clone, Debug, PartialEq)]
struct Config {
    width: i64,
}

#[derive(Debug, ShallowClone)]
struct Named {
    w: Tensor,
    lin: nn::Linear,
    config: Config,
    layers: Vec<nn::Linear>,
    scale: Option<Tensor>,
}

#[derive(ShallowClone)]
struct Pair(Tensor, f64);

#[derive(ShallowClone)]
struct Unit;

#[derive(ShallowClone)]
struct Generic<T, const N: usize> {
    items: [T; N],
}

#[derive(ShallowClone)]
enum Either<A> {
    Left(A),
    Right { t: Tensor, tag: String },
    Nothing,
}

fn main() {
    let vs = nn::VarStore::new(Device::Cpu);
    let w = Tensor::ones([2], (Kind::Float, Device::Cpu));
    let n = Named {
        w: w.shallow_clone(),
        lin: nn::linear(vs.root(), 2, 2, Default::default()),
        config: Config { width: 2 },
        layers: vec![],
        scale: None,
    };
    let c = n.shallow_clone();
    assert_eq!(c.config, n.config);
    let _ = c.w.shallow_clone().fill_(3.0);
    assert_eq!(n.w.double_value(&[0]), 3.0, "storage is shared");
    let Pair(t, x) = Pair(w.shallow_clone(), 1.5).shallow_clone();
    assert_eq!((t.numel(), x), (2, 1.5));
    let Unit = Unit.shallow_clone();
    let g = Generic { items: [1i64, 2, 3] }.shallow_clone();
    assert_eq!(g.items, [1, 2, 3]);
    match (Either::<i64>::Right { t: w, tag: "r".into() }).shallow_clone() {
        Either::Right { tag, .. } => assert_eq!(tag, "r"),
        _ => unreachable!(),
    }
    assert!(matches!(Either::Left(7i64).shallow_clone(), Either::Left(7)));
    assert!(matches!(Either::<i64>::Nothing.shallow_clone(), Either::Nothing));
}

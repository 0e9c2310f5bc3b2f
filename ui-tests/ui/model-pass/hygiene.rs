//! User names that the expansion must neither capture nor shadow: fields, parameters and
//! per-call values called like the generated code's locals and parameters.
use tch::nn::{self, ModuleT};
use tch::{Device, Kind, Tensor};

fn f(xs: &Tensor) -> Tensor {
    xs * 2.0
}

ckpt::model! {
    #[checkpointed(segments = 4)]
    struct Net(vs, n: usize, root: i64, layer: i64) {
        let i: i64 = xs.size()[0],
        let ctx: Tensor = xs.ones_like(),
        #[field] root: i64 = root,
        xs: nn::Linear = nn::linear(vs, layer, layer, Default::default()),
        train: [nn::Linear; n] = nn::linear(vs, layer, layer, Default::default()),
        f,
        |h, train| h.dropout(0.1, train) * &ctx + i as f64,
        p: nn::Linear = nn::linear(vs, layer, layer, Default::default()),
    }
}

fn main() {
    let store = nn::VarStore::new(Device::Cpu);
    let net = Net::new(store.root(), 2, 7, 3);
    assert_eq!(net.root, 7);
    let x = Tensor::randn([4, 3], (Kind::Float, Device::Cpu));
    let y = net.forward_t(&x, false);
    let expected =
        (x.apply(&net.xs).apply(&net.train[0]).apply(&net.train[1]) * 2.0 + 4.0).apply(&net.p);
    assert!(y.allclose(&expected, 1e-6, 1e-6, false));
    let mut names: Vec<String> = store.variables().into_keys().collect();
    names.sort();
    assert_eq!(names[0], "p.bias");
    assert_eq!(names[2], "train.0.bias");
}

//! Generic functions, generic impls, `where` clauses and `impl Trait` arguments.
use ckpt::{checkpointed, ShallowClone, Stash};
use tch::{nn, nn::Module, Device, Kind, Tensor};

#[checkpointed(segments = 2)]
fn apply<M: Module + ShallowClone + Send + 'static>(m: &M, xs: &Tensor) -> Tensor {
    let h = m.forward(xs).relu();
    m.forward(&h)
}

#[checkpointed(segments = 3)]
fn scaled<T>(xs: &Tensor, k: T) -> Tensor
where
    T: Stash + ShallowClone + Copy + Into<f64>,
{
    let h = xs * k.into();
    let h = h.tanh() * k.into();
    h.exp()
}

#[checkpointed(segments = 2)]
fn with_impl(
    m: &(impl Module + ShallowClone + Send + 'static),
    xs: &Tensor,
    scale: impl Into<f64> + Stash,
) -> Tensor {
    let h = m.forward(xs) * scale.into();
    h.tanh()
}

#[derive(Debug, ShallowClone)]
struct Stack<M> {
    layers: Vec<M>,
}

impl<M> Stack<M>
where
    M: Module + ShallowClone + Send + 'static,
{
    #[checkpointed(segments = 2)]
    fn forward(&self, xs: &Tensor) -> Tensor {
        let h = self.layers[0].forward(xs).relu();
        self.layers[1].forward(&h)
    }
}

fn main() {
    let vs = nn::VarStore::new(Device::Cpu);
    let lin = nn::linear(vs.root() / "a", 3, 3, Default::default());
    let xs = Tensor::randn([2, 3], (Kind::Float, Device::Cpu));
    let stack = Stack {
        layers: vec![lin.shallow_clone(), nn::linear(vs.root() / "b", 3, 3, Default::default())],
    };
    let y = apply(&lin, &xs) + scaled(&xs, 0.5f32) + stack.forward(&xs);
    let y = y + with_impl(&lin, &xs, 2.0f32);
    y.sum(Kind::Float).backward();
    assert!(lin.ws.grad().defined());
}

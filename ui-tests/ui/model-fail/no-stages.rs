use tch::Tensor;

ckpt::model! {
    struct Empty(p) {
        let mask: Tensor = xs.ne(0),
        #[field] scale: f64 = 2.0,
    }
}

fn main() {}

#[derive(ckpt::ShallowClone)]
union Bits {
    i: i64,
    f: f64,
}

fn main() {}

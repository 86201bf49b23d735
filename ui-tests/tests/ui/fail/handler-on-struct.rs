use chatter_runtime::{BoxError, HandlerContext, handler};

#[handler]
struct NotAFunction;

fn main() {}

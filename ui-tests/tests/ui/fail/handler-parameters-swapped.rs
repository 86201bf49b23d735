use chatter_runtime::{BoxError, HandlerContext, handler};
use chatter_ui_tests::CreateOrder;

#[handler]
async fn create_order(_ctx: &mut HandlerContext, _command: CreateOrder) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}

use chatter_runtime::{BoxError, HandlerContext, handler};
use chatter_ui_tests::CreateOrder;

#[handler]
async fn create_order(_command: CreateOrder, _ctx: &HandlerContext) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}

use chatter_runtime::{BoxError, HandlerContext, handler};
use chatter_ui_tests::CreateOrder;

pub struct Settings;

#[handler]
async fn create_order(
    _command: CreateOrder,
    _ctx: &mut HandlerContext,
    _settings: &Settings,
) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}

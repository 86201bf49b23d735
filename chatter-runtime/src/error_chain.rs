//! [`ErrorChain`]: an error and its causes as one sentence. Its one home is the change-feed
//! crate at the bottom of the stack; chatter's errors follow the same rule (what failed in
//! `Display`, why in `source()`), so it serves both.

pub use cosmos_change_feed::ErrorChain;

/// The text a caught panic was raised with (`panic!("..")` carries a `&str` or a `String`), for
/// the error that reports it: a handler's (the pipeline) or a pending filter's (the relay).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|text| (*text).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error;

    /// The Rust API guidelines' rule, held for one error of every kind that has a cause: its
    /// own `Display` never repeats the cause that `source()` returns.
    #[test]
    fn no_error_prints_its_source_in_its_own_display() {
        use crate::broker::BrokerError;
        use crate::cosmos::CosmosStoreError;
        use crate::pipeline::PipelineError;
        use crate::relay::error::DrainError;
        use crate::runtime::StartError;

        let sdk = || {
            "not an endpoint"
                .parse::<azure_data_cosmos::AccountEndpoint>()
                .unwrap_err()
        };
        let json = || serde_json::from_str::<serde_json::Value>("{").unwrap_err();
        let transport = || BrokerError::transport("connect", std::io::Error::other("refused"));
        let unreachable = || CosmosStoreError::Unreachable {
            endpoint: "http://127.0.0.1:9/".into(),
            source: sdk(),
        };
        let errors: Vec<Box<dyn Error>> = vec![
            Box::new(unreachable()),
            Box::new(CosmosStoreError::request("read_item", sdk())),
            Box::new(CosmosStoreError::codec("read_item", json())),
            Box::new(transport()),
            Box::new(PipelineError::NotJson {
                command: "C",
                message_id: "m".into(),
                source: json(),
            }),
            Box::new(PipelineError::Cosmos {
                command: "C",
                message_id: "m".into(),
                source: Box::new(unreachable()),
            }),
            Box::new(StartError::Container {
                command: "C",
                database: "d",
                container: "c",
                source: Box::new(unreachable()),
            }),
            Box::new(StartError::Subscribe {
                destination: "d",
                source: transport(),
            }),
            Box::new(DrainError::Publish {
                message_id: "m".into(),
                destination: "d".into(),
                source: transport(),
            }),
        ];
        for error in errors {
            let cause = error
                .source()
                .expect("every sample has a cause")
                .to_string();
            let own = error.to_string();
            assert!(!own.contains(&cause), "`{own}` repeats its cause `{cause}`");
            assert_eq!(
                ErrorChain(&*error).to_string(),
                format!("{own}: {}", ErrorChain(error.source().unwrap()))
            );
        }
    }
}

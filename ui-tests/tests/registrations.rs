//! Every compile-pass case of the derive and `#[handler]`: each module is a registration they
//! accept, and its `check` asserts what they registered. An ordinary test crate, not a trybuild
//! case: it compiles with the workspace (no crate of its own to build), and trybuild, left with
//! failing cases only, type-checks them (`cargo check`) instead of building and linking each.

mod declared_identities {
    use chatter_runtime::{DocumentReliable, HandlerContext, handler};
    use serde::{Deserialize, Serialize};

    /// Reserves stock.
    #[derive(Serialize, Deserialize, DocumentReliable)]
    #[cosmos(
        database = "shop",
        container = "stock",
        lease = "stock-leases",
        monitored_source = "stock-source",
        lease_source = "stock-lease-source"
    )]
    #[partition_key(path = "/sku")]
    pub(crate) struct ReserveStock {
        pub(crate) sku: String,
    }

    /// Posts a ledger entry. A declared source identity is an opaque token, not a Cosmos resource
    /// name: `/` (and any other non-blank text) is fine.
    #[derive(Serialize, Deserialize, DocumentReliable)]
    #[cosmos(
        database = "finance",
        container = "ledger",
        lease = "ledger-leases",
        monitored_source = "fin/ledger",
        lease_source = "fin/ledger-leases?#\\"
    )]
    #[partition_key(path = "/account")]
    pub(crate) struct PostEntry {
        pub(crate) account: String,
    }

    #[handler]
    async fn post(_command: PostEntry, _ctx: &mut HandlerContext) -> Result<(), std::io::Error> {
        Ok(())
    }

    #[handler]
    async fn reserve(
        _command: ReserveStock,
        _ctx: &mut HandlerContext,
    ) -> Result<(), std::io::Error> {
        Ok(())
    }

    pub(crate) fn check() {
        let declared = ReserveStock::registration()
            .declared_source_identity
            .unwrap();
        assert_eq!(
            (declared.monitored, declared.lease),
            ("stock-source", "stock-lease-source")
        );
        let declared = PostEntry::registration().declared_source_identity.unwrap();
        assert_eq!(
            (declared.monitored, declared.lease),
            ("fin/ledger", "fin/ledger-leases?#\\")
        );
    }
}

mod delivery_attempts {
    use chatter_runtime::DocumentReliable;
    use serde::{Deserialize, Serialize};

    /// Charges a card; a failing charge is tried at most twice before it is dead-lettered.
    #[derive(Serialize, Deserialize, DocumentReliable)]
    #[cosmos(database = "shop", container = "payments", lease = "payments-leases")]
    #[partition_key(path = "/paymentId")]
    #[chatter(name = "ChargeCard", max_delivery_attempts = 2)]
    #[serde(rename_all = "camelCase")]
    pub(crate) struct ChargeCard {
        pub(crate) payment_id: String,
    }

    pub(crate) fn check() {
        assert_eq!(
            ChargeCard::DOCUMENT_RELIABILITY.max_delivery_attempts,
            Some(2)
        );
    }
}

mod field_marked_partition_key {
    use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, handler};
    use serde::{Deserialize, Serialize};

    /// Registers a tenant's user; the container is partitioned by `/tenantId`.
    #[derive(Serialize, Deserialize, DocumentReliable)]
    #[cosmos(database = "identity", container = "users", lease = "users-leases")]
    #[partition_key(path = "/tenantId")]
    pub(crate) struct RegisterUser {
        #[partition_key]
        pub(crate) organisation: String,
        pub(crate) email: String,
    }

    #[handler]
    async fn register(_command: RegisterUser, _ctx: &mut HandlerContext) -> Result<(), BoxError> {
        Ok(())
    }

    pub(crate) fn check() {
        assert_eq!(
            RegisterUser::registration()
                .partition_key
                .iter()
                .map(|level| level.pointer)
                .collect::<Vec<_>>(),
            &["/organisation"]
        );
    }
}

mod handler_with_state {
    // A handler taking application state as its third parameter.

    use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, State, handler};
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, DocumentReliable)]
    #[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
    #[partition_key(path = "/order_id")]
    pub(crate) struct PlaceOrder {
        pub(crate) order_id: String,
    }

    pub(crate) struct Pricing {
        pub(crate) cents: u32,
    }

    #[handler]
    async fn place_order(
        command: PlaceOrder,
        ctx: &mut HandlerContext,
        pricing: State<Pricing>,
    ) -> Result<(), BoxError> {
        ctx.send_json(
            &format!("priced-{}", command.order_id),
            "OrderPriced",
            &pricing.cents,
        )?;
        Ok(())
    }

    pub(crate) fn check() {}
}

mod hierarchical_key {
    use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, handler};
    use serde::{Deserialize, Serialize};

    /// Records a meter reading.
    #[derive(Serialize, Deserialize, DocumentReliable)]
    #[cosmos(database = "iot", container = "readings", lease = "readings-leases")]
    #[partition_key(path = "/tenant", path = "/site", path = "/meter")]
    #[serde(rename_all = "camelCase")]
    pub(crate) struct RecordReading {
        pub(crate) tenant: String,
        pub(crate) site: String,
        #[partition_key(path = "/meter")]
        pub(crate) meter_number: u64,
        pub(crate) value: f64,
    }

    #[handler]
    async fn record(_command: RecordReading, _ctx: &mut HandlerContext) -> Result<(), BoxError> {
        Ok(())
    }

    pub(crate) fn check() {
        let r = RecordReading::registration();
        assert_eq!(
            r.partition_key_paths().collect::<Vec<_>>(),
            &["/tenant", "/site", "/meter"]
        );
        assert_eq!(
            r.partition_key
                .iter()
                .map(|level| level.pointer)
                .collect::<Vec<_>>(),
            &["/tenant", "/site", "/meterNumber"]
        );
    }
}

mod inbox {
    // A standalone-inbox command and its handler.

    use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, handler};
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, DocumentReliable)]
    #[inbox(database = "mail", container = "idempotency", marker_ttl = 604800)]
    pub(crate) struct SendReceipt {
        pub(crate) order_id: String,
    }

    #[handler]
    async fn send_receipt(
        _command: SendReceipt,
        _ctx: &mut HandlerContext,
    ) -> Result<(), BoxError> {
        Ok(())
    }

    pub(crate) fn check() {
        let declared = SendReceipt::DOCUMENT_RELIABILITY.standalone_inbox.unwrap();
        assert_eq!(declared.partition_key_path, "/idempotencyKey");
        assert_eq!(declared.marker_ttl_seconds, Some(604800));
        assert_eq!(
            SendReceipt::DOCUMENT_RELIABILITY.lease,
            "",
            "no lease: it sends nothing"
        );
        let announced = AnnounceReceipt::DOCUMENT_RELIABILITY;
        assert_eq!(announced.lease, "idempotency-leases");
        let outbox_key = announced.standalone_inbox.unwrap().outbox_partition_key;
        assert_eq!(outbox_key.len(), 1);
        assert_eq!(outbox_key[0].path, "/idempotencyKey");
    }

    // One whose handler sends: its relay's lease container.
    #[derive(Serialize, Deserialize, DocumentReliable)]
    #[inbox(
        database = "mail",
        container = "announced",
        lease = "idempotency-leases"
    )]
    pub(crate) struct AnnounceReceipt {
        pub(crate) order_id: String,
    }

    #[handler]
    async fn announce_receipt(
        command: AnnounceReceipt,
        ctx: &mut HandlerContext,
    ) -> Result<(), BoxError> {
        ctx.send_json("receipt-sent", "receipts", &command.order_id)?;
        Ok(())
    }
}

mod nested_path {
    use chatter_runtime::{DocumentReliable, HandlerContext, handler};
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize)]
    pub(crate) struct Customer {
        pub(crate) id: String,
    }

    /// Opens an account for a customer.
    #[derive(Serialize, Deserialize, DocumentReliable)]
    #[cosmos(database = "bank", container = "accounts", lease = "accounts-leases")]
    #[partition_key(path = "/customer/id")]
    pub(crate) struct OpenAccount {
        pub(crate) customer: Customer,
    }

    #[handler]
    async fn open(_command: OpenAccount, _ctx: &mut HandlerContext) {}

    pub(crate) fn check() {
        let r = OpenAccount::registration();
        assert_eq!(
            r.partition_key_paths().collect::<Vec<_>>(),
            &["/customer/id"]
        );
        let json = serde_json::json!({ "customer": { "id": "c-1" } });
        assert_eq!(
            r.resolve_partition_key(&json),
            Some(vec![serde_json::json!("c-1")])
        );
    }
}

mod plain {
    use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, handler};
    use serde::{Deserialize, Serialize};

    /// Places an order.
    #[derive(Serialize, Deserialize, DocumentReliable)]
    #[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
    #[partition_key(path = "/orderId")]
    #[serde(rename_all = "camelCase")]
    pub(crate) struct CreateOrder {
        pub(crate) order_id: String,
        pub(crate) quantity: u32,
    }

    #[handler]
    async fn create_order(
        _command: CreateOrder,
        _ctx: &mut HandlerContext,
    ) -> Result<(), BoxError> {
        Ok(())
    }

    pub(crate) fn check() {
        let registration = <CreateOrder as DocumentReliable>::registration();
        assert_eq!(registration.command_name, "CreateOrder");
        assert_eq!(registration.destination, "CreateOrder");
        assert_eq!(
            registration.partition_key_paths().collect::<Vec<_>>(),
            &["/orderId"]
        );
        assert_eq!(
            registration
                .partition_key
                .iter()
                .map(|level| level.pointer)
                .collect::<Vec<_>>(),
            &["/orderId"]
        );
        assert!(
            CreateOrder::DOCUMENT_RELIABILITY
                .declared_source_identity
                .is_none()
        );
    }
}

mod renamed_field {
    use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, handler};
    use serde::{Deserialize, Serialize};

    /// Posts a ledger entry.
    #[derive(Serialize, Deserialize, DocumentReliable)]
    #[cosmos(database = "finance", container = "ledger", lease = "ledger-leases")]
    #[partition_key(path = "/account")]
    #[chatter(name = "ledger.post", destination = "ledger-commands")]
    pub(crate) struct PostLedgerEntry {
        #[serde(rename = "account")]
        pub(crate) account_number: String,
        pub(crate) amount_cents: i64,
    }

    #[handler]
    async fn post(_command: PostLedgerEntry, _ctx: &mut HandlerContext) -> Result<(), BoxError> {
        Ok(())
    }

    pub(crate) fn check() {
        let r = PostLedgerEntry::registration();
        assert_eq!(r.command_name, "ledger.post");
        assert_eq!(r.destination, "ledger-commands");
        assert_eq!(
            r.partition_key
                .iter()
                .map(|level| level.pointer)
                .collect::<Vec<_>>(),
            &["/account"]
        );
    }
}

#[test]
fn every_registration_the_derive_accepts_registers_what_it_declares() {
    declared_identities::check();
    delivery_attempts::check();
    field_marked_partition_key::check();
    handler_with_state::check();
    hierarchical_key::check();
    inbox::check();
    nested_path::check();
    plain::check();
    renamed_field::check();
}

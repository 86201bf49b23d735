//! The relay side of chatter: reading the monitored containers' change feeds.
pub mod change_feed;
pub mod contract;
pub mod drain;
pub mod host;
pub mod identity;

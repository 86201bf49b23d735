//! The relay side of chatter: reading the monitored containers' change feeds.
pub mod change_feed;
pub mod drain;

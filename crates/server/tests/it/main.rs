//! The server crate's integration tests, in one binary: one link instead of one per file.

mod support;

mod admin;
mod auth;
mod bad_input;
mod bounds;
mod broadcast;
mod chat_history;
mod cluster;
mod coalescing;
mod compact;
mod compression;
mod direct;
mod feeds;
mod heartbeat;
mod http_api;
mod http_transports;
mod lifecycle;
mod limits;
mod locks;
mod policy;
mod requests;
mod resume;
mod routes;
mod server_api;
mod smoke;
mod spatial;
mod status;
mod tickets;
mod trajectory;
mod web;
mod webhooks;

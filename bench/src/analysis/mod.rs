//! From samples to the numbers the report quotes: medians and spreads per
//! (backend, case) ([`statistics`]), and lockkit's ratios to hand-written
//! Diesel and to pgbench, with their targets ([`ratios`]).

pub mod ratios;
pub mod statistics;

//! Behaviour tests of the strategy searches.

mod strategy_search;

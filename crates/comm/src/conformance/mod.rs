//! The conformance suite every backend runs: each operation against a serial reference.
//!
//! A case is a function every rank of a communicator calls with its own communicator. Inputs
//! are a pure function of (rank, index, salt), so each rank computes the serial reference for
//! the whole group by itself and checks its own output exactly (the values are small integers,
//! exact in every dtype and in any summation order). Sizes are chosen to be uneven: lengths
//! that do not divide by the rank count, fewer rows than ranks, empty buffers, and buffers
//! larger than one reduction block.
//!
//! Backends instantiate the suite the way burn's `testgen_all!` does: [`testgen!`] expands to
//! one `#[test]` per case calling a runner the backend writes (the local backend runs each case
//! on 1, 2, 3, 4 and 8 ranks), and [`CASES`] lists the same cases for runners that are not
//! libtest (the MPI runner under `mpirun`).
//!
//! [`testgen!`]: crate::testgen
//!
//! The cases are grouped by the family of operations they check: `data_movement` (barrier,
//! broadcast, all-gather, all-to-all), `reductions`, `bitwise_reductions` (deterministic and
//! element-type), `started` (nonblocking collectives), `point_to_point`, `groups` and
//! `invalid_arguments`; `reference` holds the inputs and serial references they share.

mod bitwise_reductions;
mod data_movement;
mod groups;
mod invalid_arguments;
mod point_to_point;
mod reductions;
mod reference;
mod started;

use std::fmt;

use crate::{CommError, Communicator};

pub use self::bitwise_reductions::{all_reduce_deterministic, all_reduce_in_element_type};
pub use self::data_movement::{
    all_gather, all_gather_v, all_to_all, all_to_all_v, barrier, broadcast,
};
pub use self::groups::{concurrent_groups, split_and_groups};
pub use self::invalid_arguments::invalid_arguments_poison_nothing;
pub use self::point_to_point::send_recv;
pub use self::reductions::{all_reduce, all_reduce_tensor_and_slices, reduce_scatter};
pub use self::started::started_collectives;

/// Why a case failed on one rank.
#[derive(Debug)]
pub enum CaseFailure {
    /// A call returned an error.
    Comm(CommError),
    /// A call returned a wrong result.
    Wrong {
        /// The rank that saw it.
        rank: usize,
        /// The group size.
        size: usize,
        /// Which check, and the first difference.
        detail: String,
    },
}

impl fmt::Display for CaseFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaseFailure::Comm(err) => write!(f, "{err}"),
            CaseFailure::Wrong { rank, size, detail } => {
                write!(f, "rank {rank} of {size}: wrong result: {detail}")
            }
        }
    }
}

impl std::error::Error for CaseFailure {}

impl From<CommError> for CaseFailure {
    fn from(err: CommError) -> CaseFailure {
        CaseFailure::Comm(err)
    }
}

/// The result of one case on one rank.
pub type CaseResult = Result<(), CaseFailure>;

/// One conformance case.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    /// The case's name (its function's name).
    pub name: &'static str,
    /// Runs the case on this rank.
    pub run: fn(&dyn Communicator) -> CaseResult,
}

/// Calls `$callback!(prefix…; case, case, …)` with the list of case functions.
#[doc(hidden)]
#[macro_export]
macro_rules! __comm_case_list {
    ($callback:ident ! ($($prefix:tt)*)) => {
        $crate::$callback!($($prefix)*
            barrier, broadcast, all_reduce, all_reduce_tensor_and_slices, reduce_scatter,
            all_reduce_deterministic, all_reduce_in_element_type, started_collectives,
            all_gather, all_gather_v, all_to_all, all_to_all_v, send_recv, split_and_groups,
            concurrent_groups, invalid_arguments_poison_nothing
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __comm_case_array {
    ($($case:ident),*) => {
        /// Every case, in a stable order.
        pub const CASES: &[Case] = &[$(Case { name: stringify!($case), run: $case }),*];
    };
}

__comm_case_list!(__comm_case_array!());

/// Expands to one `#[test]` per conformance case, each calling `runner(&Case)`.
///
/// ```
/// fn run_local(case: &comm::conformance::Case) {
///     for result in comm::LocalCluster::new(2).unwrap().run(|c| (case.run)(&c)) {
///         result.unwrap().unwrap();
///     }
/// }
/// comm::testgen!(run_local);
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! testgen {
    ($runner:path) => {
        $crate::__comm_case_list!(testgen!(@tests $runner;));
    };
    (@tests $runner:path; $($case:ident),*) => {
        $(
            #[test]
            fn $case() {
                $runner(&$crate::conformance::Case {
                    name: stringify!($case),
                    run: $crate::conformance::$case,
                });
            }
        )*
    };
}

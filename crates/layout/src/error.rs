//! The one error type of the layout crate.

use std::fmt;

/// Everything that can be wrong with a mesh, a layout or a layout bound to a shape.
///
/// Each variant names the culprit (the alias, the dim, the sizes) so a message can be shown to a
/// user as is. Messages follow MindSpore's wording where MindSpore has one, so users find them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// `device_matrix` and `alias_name` have different lengths.
    #[error("device_matrix length should be equal to alias_name length (device_matrix has {n_dims} entries, alias_name has {n_aliases})")]
    AliasCountMismatch {
        /// Entries in the device matrix.
        n_dims: usize,
        /// Entries in the alias list.
        n_aliases: usize,
    },
    /// A mesh needs at least one axis.
    #[error("a device matrix needs at least one axis")]
    EmptyDeviceMatrix,
    /// An axis of size zero.
    #[error("axis {alias} of the device matrix has size 0; every axis needs at least one device")]
    ZeroAxisSize {
        /// The axis with size zero.
        alias: String,
    },
    /// The same alias appears twice in `alias_name`.
    #[error(
        "Each element of alias_name {aliases} should be different ({alias} appears more than once)"
    )]
    DuplicateAlias {
        /// The repeated alias.
        alias: String,
        /// The whole alias tuple, formatted.
        aliases: String,
    },
    /// An alias is the empty string.
    #[error("The element of alias_name can not be an empty string")]
    EmptyAlias,
    /// An alias is the reserved word `"None"`.
    #[error("The element of alias_name can not set 'None', because 'None' means no sharding.")]
    AliasIsNone,
    /// `interleaved_parallel` is used but not as the last alias.
    #[error("When alias_name {aliases} contains keyword 'interleaved_parallel', it should be at the last dim of alias_name, which means the virtual sharding.")]
    InterleavedNotLast {
        /// The whole alias tuple, formatted.
        aliases: String,
    },
    /// `rank_list` has the wrong length.
    #[error("The length of rank_list should be equal to the product of device_matrix, but got {got} and {expected}.")]
    RankListLength {
        /// Length of the given rank list.
        got: usize,
        /// Product of the device matrix.
        expected: usize,
    },
    /// An interleaved mesh's rank list does not keep the `k` virtual copies of each mesh position
    /// on one device in copy order (slot `s` must hold virtual rank `r*k + s % k`).
    #[error("rank_list of an interleaved_parallel mesh (k = {k}) puts virtual rank {rank} at slot {slot}, where virtual rank {expected} belongs: the {k} slots of one mesh position must be the virtual ranks r*{k} .. r*{k}+{} of one device r, in order", .k - 1)]
    InterleavedRankList {
        /// The slot (position in the rank list).
        slot: usize,
        /// The virtual rank found there.
        rank: usize,
        /// The interleave factor.
        k: usize,
        /// The virtual rank the slot needs.
        expected: usize,
    },
    /// `rank_list` names a rank twice.
    #[error("rank_list names rank {rank} more than once")]
    DuplicateRank {
        /// The repeated rank.
        rank: usize,
    },
    /// A tensor-map entry names an alias the mesh does not have.
    #[error("The axis {alias} is not found in {aliases}")]
    UnknownAlias {
        /// The unknown alias.
        alias: String,
        /// The mesh's aliases, formatted.
        aliases: String,
    },
    /// One mesh axis is used by two tensor dims, or twice in one dim.
    #[error("The axis {alias} has been set more than one in {aliases}")]
    AxisUsedTwice {
        /// The alias used twice.
        alias: String,
        /// The mesh's aliases, formatted.
        aliases: String,
    },
    /// A layout was used before a tensor map was applied to it.
    #[error("The tensor_map of layout is None")]
    TensorMapNotSet,
    /// A MindSpore tensor-map value is outside `-1..len(device_matrix)`.
    #[error("tensor_map value {value} for tensor dim {dim} is out of range for a device matrix of {n_axes} axes (valid: -1..{n_axes})")]
    TensorMapOutOfRange {
        /// The tensor dim.
        dim: usize,
        /// The offending value.
        value: i64,
        /// Number of device-matrix axes.
        n_axes: usize,
    },
    /// The layout has a different number of dims than the shape it is bound to.
    #[error("layout has {layout_dims} tensor dims but the shape {shape:?} has {shape_dims}")]
    RankMismatch {
        /// Dims in the layout.
        layout_dims: usize,
        /// Dims in the shape.
        shape_dims: usize,
        /// The shape.
        shape: Vec<usize>,
    },
    /// A dim's size is not divisible by the product of the axes that split it.
    #[error("dim {dim} of shape {shape:?} has size {size}, which is not divisible by {split} (split over {axes})")]
    NotDivisible {
        /// The tensor dim.
        dim: usize,
        /// Its size.
        size: usize,
        /// Product of the axes splitting it.
        split: usize,
        /// The axes, formatted as `dp(2)*mp(4)`.
        axes: String,
        /// The whole shape.
        shape: Vec<usize>,
    },
    /// A manual row split does not fit the tensor: the wrong number of blocks, a block without
    /// rows, or sizes that do not add up to the rows.
    #[error("manual row split {sizes:?}: {rule}")]
    BadRowSplit {
        /// The rows per block, as given.
        sizes: Vec<usize>,
        /// The rule broken, with the tensor's shape.
        rule: String,
    },
    /// A strategy entry is zero.
    #[error(
        "strategy {strategy:?}: entry {dim} is 0; every dim needs a split factor of at least 1"
    )]
    ZeroStrategy {
        /// The strategy.
        strategy: Vec<usize>,
        /// The zero entry.
        dim: usize,
    },
    /// A strategy uses a device count that does not divide the devices available.
    #[error("strategy {strategy:?} uses {used} devices, which does not divide the {device_num} devices available")]
    StrategyDeviceMismatch {
        /// The strategy.
        strategy: Vec<usize>,
        /// Devices the strategy uses (product).
        used: usize,
        /// Devices available.
        device_num: usize,
    },
    /// An axis index is out of range for the mesh.
    #[error("mesh axis index {index} is out of range for a mesh of {n_axes} axes")]
    AxisOutOfRange {
        /// The index.
        index: usize,
        /// Number of axes.
        n_axes: usize,
    },
    /// A coordinate index along an axis is out of range.
    #[error("index {index} is out of range for axis {alias} of size {size}")]
    AxisIndexOutOfRange {
        /// The axis.
        alias: String,
        /// The index.
        index: usize,
        /// The axis size.
        size: usize,
    },
    /// A rank that is not part of the mesh.
    #[error("rank {rank} is not in the mesh (ranks: {ranks})")]
    RankNotInMesh {
        /// The rank.
        rank: usize,
        /// The mesh's ranks, formatted.
        ranks: String,
    },
    /// Factors that do not multiply to the axis they should split.
    #[error("cannot split axis {alias} of size {size} into factors {factors:?} (their product is {product})")]
    BadAxisSplit {
        /// The axis.
        alias: String,
        /// Its size.
        size: usize,
        /// The factors.
        factors: Vec<usize>,
        /// Their product.
        product: usize,
    },
    /// Optimizer sharding was asked for but cannot be applied.
    #[error("optimizer shard of size {shard_size} is not possible: {reason}")]
    OptimizerShard {
        /// Requested shard size.
        shard_size: usize,
        /// Why not.
        reason: String,
    },
    /// A mesh with more ranks than the process-wide ceiling ([`crate::limits::max_ranks`]).
    #[error("device matrix {device_matrix:?} has {} ranks, above the limit of {max} ranks per mesh (set TESSERA_MAX_RANKS to change the limit)", fmt_rank_count(.n_ranks))]
    TooManyRanks {
        /// The axis sizes.
        device_matrix: Vec<usize>,
        /// Their product, `None` when it overflows `usize`.
        n_ranks: Option<usize>,
        /// The ceiling in force.
        max: usize,
    },
    /// A mesh with more axes than [`crate::limits::MAX_MESH_AXES`].
    #[error("a device matrix of {n_axes} axes is above the limit of {max} axes")]
    TooManyAxes {
        /// Axes asked for.
        n_axes: usize,
        /// The limit.
        max: usize,
    },
    /// A rank in a rank list at or above the rank ceiling.
    #[error("rank {rank} in rank_list is above the limit of {max} ranks (ranks are 0..{max}; set TESSERA_MAX_RANKS to change the limit)")]
    RankAboveCeiling {
        /// The rank.
        rank: usize,
        /// The ceiling in force.
        max: usize,
    },
    /// A rank ceiling that is not a positive integer.
    #[error("TESSERA_MAX_RANKS = {value:?} is not a positive integer")]
    BadRankCeiling {
        /// The text given.
        value: String,
    },
    /// An element count or offset overflows `usize`.
    #[error("shape {shape:?} has more elements than fit in memory addressing")]
    Overflow {
        /// The shape.
        shape: Vec<usize>,
    },
}

/// A rank count for a message: the number, or a note that the product overflows.
fn fmt_rank_count(n_ranks: &Option<usize>) -> String {
    match n_ranks {
        Some(n) => n.to_string(),
        None => format!("more than {} (the product overflows)", usize::MAX),
    }
}

/// Formats a list of aliases the way Python prints a tuple: `('dp', 'mp')`.
pub(crate) fn py_tuple<S: AsRef<str>>(aliases: &[S]) -> String {
    struct Tuple<'a, S>(&'a [S]);
    impl<S: AsRef<str>> fmt::Display for Tuple<'_, S> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("(")?;
            for (i, a) in self.0.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "'{}'", a.as_ref())?;
            }
            if self.0.len() == 1 {
                f.write_str(",")?;
            }
            f.write_str(")")
        }
    }
    Tuple(aliases).to_string()
}

//! [`Dataset`]: what a session reads its batches through — samples addressed by index, each a
//! row of every column (an input and a label, or any number of columns) — and the one function
//! that feeds a rank's rows of a batch of any data set into an executor, each graph input from
//! the column bound to it.
//!
//! The built-in data sets implement it: [`IdxDataset`] (images and their class labels) and
//! [`TokenWindows`] (the windows of a token split: the sample at index `s` is the window of
//! `seq_len + 1` tokens starting at token `s`). A user's data set implements it to train any
//! network with [`crate::Trainer::with_dataset`].

use exec::RankExecutor;
use graph::ValueId;
use tensor::{DType, Tensor};

use super::idx::IdxDataset;
use super::text::TokenSplit;
use crate::error::RuntimeError;

/// One sample's input or label as a data set hands it out: its shape (without the batch dim)
/// and its dtype.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleSpec {
    /// The shape of one sample (a batch of `k` samples is `[k, ..shape]`).
    pub shape: Vec<usize>,
    /// The element type.
    pub dtype: DType,
}

/// A data set of samples addressed by index `0..len()`, each a row of every column: by
/// default two columns, the input (column 0, [`Dataset::read_inputs`]) and the label (column
/// 1, [`Dataset::read_labels`]); a data set of another number of columns (MindSpore's
/// datasets of `k` columns fed positionally to a network's `construct(c1, ..., ck)`) overrides
/// [`Dataset::columns`], [`Dataset::column_spec`] and [`Dataset::read_column`].
///
/// A batch is a list of sample indices, the same on every rank and every device count
/// ([`crate::BatchPlan`]); each rank reads only the samples of its rows, so the reads must
/// return the same values for an index whichever other indices they are asked with. Reads may
/// come from several rank threads at once.
pub trait Dataset: Send + Sync + std::fmt::Debug {
    /// The number of samples.
    fn len(&self) -> usize;

    /// Whether the data set has no sample.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The shape and dtype of one sample's input.
    fn input_spec(&self) -> SampleSpec;

    /// The shape and dtype of one sample's label.
    fn label_spec(&self) -> SampleSpec;

    /// The inputs of samples `indices`, in that order: a tensor `[indices.len(), ..input
    /// shape]` of the input dtype.
    fn read_inputs(&self, indices: &[usize]) -> Result<Tensor, RuntimeError>;

    /// The labels of samples `indices`, in that order: a tensor `[indices.len(), ..label
    /// shape]` of the label dtype.
    fn read_labels(&self, indices: &[usize]) -> Result<Tensor, RuntimeError>;

    /// The number of columns (default 2: the input and the label).
    fn columns(&self) -> usize {
        2
    }

    /// The shape and dtype of one sample's `column` (default: column 0 the input's, column 1
    /// the label's); `None` past the last column.
    fn column_spec(&self, column: usize) -> Option<SampleSpec> {
        match column {
            0 => Some(self.input_spec()),
            1 => Some(self.label_spec()),
            _ => None,
        }
    }

    /// Column `column` of samples `indices`, in that order: a tensor `[indices.len(),
    /// ..shape]` of its [`Dataset::column_spec`] (default: column 0 [`Dataset::read_inputs`],
    /// column 1 [`Dataset::read_labels`]; another column is an error naming it).
    fn read_column(&self, column: usize, indices: &[usize]) -> Result<Tensor, RuntimeError> {
        match column {
            0 => self.read_inputs(indices),
            1 => self.read_labels(indices),
            _ => Err(no_column(column, self.columns())),
        }
    }
}

/// The error of a read of column `column` of a data set of `columns` columns.
fn no_column(column: usize, columns: usize) -> RuntimeError {
    RuntimeError::Mismatch {
        what: format!("column {column} of the data set"),
        expected: format!("a column below {columns} (the data set's columns)"),
        got: format!("column {column}"),
    }
}

impl Dataset for IdxDataset {
    fn len(&self) -> usize {
        IdxDataset::len(self)
    }

    fn input_spec(&self) -> SampleSpec {
        SampleSpec {
            shape: self.image_shape().to_vec(),
            dtype: DType::F32,
        }
    }

    fn label_spec(&self) -> SampleSpec {
        SampleSpec {
            shape: Vec::new(),
            dtype: DType::I32,
        }
    }

    fn read_inputs(&self, indices: &[usize]) -> Result<Tensor, RuntimeError> {
        self.read_images(indices)
    }

    fn read_labels(&self, indices: &[usize]) -> Result<Tensor, RuntimeError> {
        IdxDataset::read_labels(self, indices)
    }
}

/// The windows of a token split as a [`Dataset`]: sample `s` is the window of `seq_len + 1`
/// tokens starting at token `s`; its input is the window's first `seq_len` tokens and its label
/// the last `seq_len` (the next token of each), both i32.
#[derive(Debug, Clone, Copy)]
pub struct TokenWindows<'s> {
    split: &'s TokenSplit,
    seq_len: usize,
}

impl<'s> TokenWindows<'s> {
    /// The windows of `seq_len + 1` tokens of `split`.
    pub fn new(split: &'s TokenSplit, seq_len: usize) -> TokenWindows<'s> {
        TokenWindows { split, seq_len }
    }

    fn read(&self, indices: &[usize], labels: bool) -> Result<Tensor, RuntimeError> {
        let starts: Vec<u64> = indices.iter().map(|&s| s as u64).collect();
        let (inputs, targets) = self.split.read_rows(&starts, self.seq_len)?;
        let ids = if labels { targets } else { inputs };
        let ids: Vec<i32> = ids.into_iter().map(|t| t as i32).collect();
        Ok(Tensor::from_vec(&[indices.len(), self.seq_len], ids)?)
    }
}

impl Dataset for TokenWindows<'_> {
    fn len(&self) -> usize {
        self.split.len().saturating_sub(self.seq_len as u64) as usize
    }

    fn input_spec(&self) -> SampleSpec {
        SampleSpec {
            shape: vec![self.seq_len],
            dtype: DType::I32,
        }
    }

    fn label_spec(&self) -> SampleSpec {
        self.input_spec()
    }

    fn read_inputs(&self, indices: &[usize]) -> Result<Tensor, RuntimeError> {
        self.read(indices, false)
    }

    fn read_labels(&self, indices: &[usize]) -> Result<Tensor, RuntimeError> {
        self.read(indices, true)
    }
}

/// Feeds this rank's rows of the batch of samples `indices` of `dataset` into `exec`'s inputs:
/// for every input the rank holds, the samples of its rows (the dim-0 range of its box), read
/// from the column bound to it — `columns[j]` is the graph input column `j` feeds (for a model
/// of a data input and labels, `[model.input, model.labels]`). An input bound to no column, or
/// to several, or a column the data set does not have, is an error naming it: no input is fed
/// another's column.
pub fn feed_rows(
    exec: &mut RankExecutor,
    columns: &[ValueId],
    dataset: &dyn Dataset,
    indices: &[usize],
) -> Result<(), RuntimeError> {
    if columns.len() > dataset.columns() {
        return Err(RuntimeError::Mismatch {
            what: "the graph inputs bound to the data set's columns".to_string(),
            expected: format!("at most {} (the data set's columns)", dataset.columns()),
            got: columns.len().to_string(),
        });
    }
    let program = exec.program().clone();
    for (i, input) in program.inputs.iter().enumerate() {
        if !exec.holds(&input.layout) {
            continue;
        }
        let column = column_of(columns, input.value, &input.name)?;
        let region = exec.box_of(&input.layout)?;
        let (first, rows) = match (region.offset.first(), region.shape.first()) {
            (Some(&s), Some(&l)) => (s, l),
            _ => (0, indices.len()),
        };
        let mine = indices
            .get(first..first + rows)
            .ok_or_else(|| RuntimeError::Mismatch {
                what: format!("rows of input {}", input.name),
                expected: format!("rows within the batch of {}", indices.len()),
                got: format!("rows {first}..{}", first + rows),
            })?;
        exec.set_input_rows(i, dataset.read_column(column, mine)?)?;
    }
    Ok(())
}

/// The one column of `columns` bound to the graph input `value` (`name`); none, or several, is
/// an error naming it.
pub(crate) fn column_of(
    columns: &[ValueId],
    value: ValueId,
    name: &str,
) -> Result<usize, RuntimeError> {
    let mut bound = columns.iter().enumerate().filter(|(_, &v)| v == value);
    match (bound.next(), bound.next()) {
        (Some((j, _)), None) => Ok(j),
        (None, _) => Err(RuntimeError::Mismatch {
            what: format!("the graph input {name}"),
            expected: format!(
                "one of the {} data set column(s) bound to it",
                columns.len()
            ),
            got: "no column (it would be fed nothing, or another input's column)".to_string(),
        }),
        (Some((j, _)), Some((k, _))) => Err(RuntimeError::Mismatch {
            what: format!("the graph input {name}"),
            expected: "one data set column bound to it".to_string(),
            got: format!("columns {j} and {k}"),
        }),
    }
}

//! The simple per-device memory estimate the searches constrain: parameters, gradients,
//! optimizer state and activations, summed over the ops' choices.
//!
//! It sits behind [`plan_memory`] alone so that a fuller memory model (the runtime's memory
//! accounting) can replace it without touching the searches.

/// Bytes one device holds, by category.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MemoryEstimate {
    /// Parameter slices.
    pub parameters: f64,
    /// Gradients of the trainable parameters.
    pub gradients: f64,
    /// Optimizer state.
    pub optimizer: f64,
    /// Forward outputs kept for the backward pass (those it reads: [`crate::HeldValues`]),
    /// and each parameter gradient the backward writes whole before its sum over devices.
    /// All are counted as held at once. This is an estimate for ranking strategies, neither
    /// bound of the step's peak: it misses the micro-batches a pipeline stage holds in flight,
    /// the backward's other values and the redistributions' buffers (the example GPT on 2
    /// stages: 8.26 MiB against 23.26 MiB), and counts at once gradients whose sums free them
    /// earlier. `tessera plan` prints the peak `tessera train --explain` predicts instead
    /// (`parallel::memory`, the compiled step's buffers walked rank by rank).
    pub activations: f64,
}

impl MemoryEstimate {
    /// The sum of the categories.
    pub fn total(&self) -> f64 {
        self.parameters + self.gradients + self.optimizer + self.activations
    }

    /// Adds `other`'s categories to this one's.
    pub fn add(&mut self, other: &MemoryEstimate) {
        self.parameters += other.parameters;
        self.gradients += other.gradients;
        self.optimizer += other.optimizer;
        self.activations += other.activations;
    }
}

/// The memory of a plan: the sum of its ops' estimates.
pub fn plan_memory<'a>(ops: impl IntoIterator<Item = &'a MemoryEstimate>) -> MemoryEstimate {
    let mut total = MemoryEstimate::default();
    for op in ops {
        total.add(op);
    }
    total
}

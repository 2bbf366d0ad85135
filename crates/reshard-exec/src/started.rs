//! Reshards started now and finished later, so that their communication runs while the caller
//! computes: a hsdp level-3 weight gathered one gather ahead of its use. A plan whose network
//! part is one all-gather (the weight's pieces, each sent whole to every member) starts that
//! all-gather on the group's communicator ([`comm::Communicator::start_all_gather_bytes`]);
//! its local copies are done at once. Any other plan runs when started.

use comm::PendingCollective;
use reshard::{lower_for, Exchange, ExchangeKind, ReshardPlan};
use tensor::Tensor;

use crate::error::ExecError;
use crate::execute::{check_inputs, copy_local, device_slots, pack, unpack, ReshardRunner};

/// A reshard started by [`ReshardRunner::start_into`], finished by
/// [`ReshardRunner::finish_into`].
#[derive(Debug)]
pub struct StartedReshard {
    /// This rank's destination slices (complete once the gather, if any, is unpacked).
    out: Vec<Tensor>,
    /// The all-gather in flight, when the plan's network part is one.
    gather: Option<StartedGather>,
}

/// An all-gather of a plan's pieces in flight.
#[derive(Debug)]
struct StartedGather {
    exchange: Exchange,
    pending: PendingCollective,
}

impl StartedReshard {
    /// Advances the communication (a backend that progresses only inside its calls needs this);
    /// whether it has completed.
    pub fn test(&mut self) -> Result<bool, ExecError> {
        match &mut self.gather {
            Some(g) => Ok(g.pending.test()?),
            None => Ok(true),
        }
    }

    /// Whether its communication runs in the background rather than having completed when
    /// started.
    pub fn is_background(&self) -> bool {
        self.gather
            .as_ref()
            .is_some_and(|g| g.pending.is_background())
    }
}

impl ReshardRunner {
    /// Starts [`ReshardRunner::run_into`] of `plan` from `local` into `out` (this rank's
    /// destination slices, allocated), to finish with [`ReshardRunner::finish_into`] on the
    /// same plan. Every member starts its reshards and collectives in the same order.
    pub fn start_into(
        &mut self,
        plan: &ReshardPlan,
        local: &[&Tensor],
        mut out: Vec<Tensor>,
    ) -> Result<StartedReshard, ExecError> {
        let me = self.rank();
        let exchange = lower_for(plan, me);
        let exchange = match exchange {
            Some(e)
                if e.kind == ExchangeKind::AllGather
                    && plan.reduce().is_none()
                    && !self.sends_messages() =>
            {
                e
            }
            _ => {
                self.run_into(plan, local, &mut out)?;
                return Ok(StartedReshard { out, gather: None });
            }
        };
        let src_slots = device_slots(plan.src().layout(), me);
        check_inputs(plan.src().layout(), &src_slots, local, plan.dtype())?;
        let dst_slots = device_slots(plan.dst(), me);
        check_inputs(
            plan.dst(),
            &dst_slots,
            &out.iter().collect::<Vec<_>>(),
            plan.dtype(),
        )?;
        let held: Vec<(usize, &Tensor)> = src_slots
            .iter()
            .copied()
            .zip(local.iter().copied())
            .collect();
        let mut slots: Vec<(usize, &mut Tensor)> =
            dst_slots.iter().copied().zip(out.iter_mut()).collect();
        copy_local(plan, me, &held, &mut slots);
        // An all-gather member sends the same pieces to every other member.
        let n = exchange.ranks.len();
        let at = exchange
            .ranks
            .iter()
            .position(|&r| r == me)
            .expect("this rank is in the exchange");
        let mut send = Vec::new();
        pack(
            plan,
            &exchange.sends(me, exchange.ranks[(at + 1) % n]),
            &held,
            &mut send,
        );
        let pending = self.group(&exchange.ranks)?.start_all_gather_bytes(send)?;
        Ok(StartedReshard {
            out,
            gather: Some(StartedGather { exchange, pending }),
        })
    }

    /// Waits for a [`ReshardRunner::start_into`] reshard of `plan`: this rank's destination
    /// slices, as [`ReshardRunner::run_into`] leaves them.
    pub fn finish_into(
        &mut self,
        plan: &ReshardPlan,
        started: StartedReshard,
    ) -> Result<Vec<Tensor>, ExecError> {
        let StartedReshard { mut out, gather } = started;
        let Some(StartedGather { exchange, pending }) = gather else {
            return Ok(out);
        };
        let me = self.rank();
        let gathered = pending.wait()?;
        let bytes = gathered.as_bytes();
        let n = exchange.ranks.len();
        if bytes.len() % n != 0 {
            return Err(ExecError::LocalMismatch {
                reason: format!(
                    "an all-gather over {n} ranks returned {} bytes",
                    bytes.len()
                ),
            });
        }
        let chunk = bytes.len() / n;
        let dst_slots = device_slots(plan.dst(), me);
        let mut slots: Vec<(usize, &mut Tensor)> =
            dst_slots.iter().copied().zip(out.iter_mut()).collect();
        for (j, &peer) in exchange.ranks.iter().enumerate() {
            if peer != me {
                let receives = exchange.sends(peer, me);
                let expected: usize = receives
                    .iter()
                    .map(|t| t.region.n_elements() * plan.dtype().size_in_bytes())
                    .sum();
                if expected != chunk {
                    return Err(ExecError::LocalMismatch {
                        reason: format!(
                            "rank {peer} gathered {chunk} bytes, the plan expects {expected}"
                        ),
                    });
                }
                unpack(
                    plan,
                    &receives,
                    &bytes[j * chunk..(j + 1) * chunk],
                    &mut slots,
                );
            }
        }
        Ok(out)
    }
}

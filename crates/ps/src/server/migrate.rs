//! A server's side of adding a server (see [`crate::migrate`]): asking the scheduler for the
//! map, handing the parameters that move over to their new owner with their optimizer state
//! and counters, taking in the ones that come, and switching to the new partition.

use std::collections::BTreeMap;

use crate::net::JobChannel as Channel;
use runtime::{state_checkpoint_name, Optimizer, ParamSpec};
use tensor::{DType, Tensor};
use tonic::{Response, Status};

use super::{ServerService, State};
use crate::auth::JobSecret;
use crate::compute::ParamInfo;
use crate::env::{JobSettings, RoleEnv};
use crate::error::PsError;
use crate::migrate::{owners, PartitionMap};
use crate::net::{message_limit, server_client};
use crate::proto::scheduler_client::SchedulerClient;
use crate::proto::*;
use crate::retry::{Attempt, RetryPolicy};
use crate::wire::{from_msg, to_msg};

/// One parameter handed to this server: its weight and optimizer state.
pub(super) struct Received {
    weight: Tensor,
    states: Vec<(&'static str, Tensor)>,
}

/// The counters an old owner sent with its handover.
#[derive(Debug, Clone, Copy)]
struct Counters {
    version: u64,
    optimizer_steps: u64,
    last_loss: f32,
}

/// A server's migration state.
#[derive(Default)]
pub(super) struct Migration {
    /// Every parameter of the job (maps are computed over them); empty: the server takes no
    /// part in migrations.
    all: Vec<ParamInfo>,
    /// The epoch whose moved parameters this server has handed over.
    sent: Option<u64>,
    /// The epoch the inbox is for.
    inbox_epoch: u64,
    /// Parameters handed to this server, by name.
    inbox: BTreeMap<String, Received>,
    /// By sending server, its counters.
    counters: BTreeMap<u32, Counters>,
}

/// The most bytes one handover carries: every parameter with its optimizer state.
pub fn handover_limit(all: &[ParamInfo], states: usize) -> usize {
    message_limit(all.iter().map(ParamInfo::bytes).sum::<usize>() * (1 + states))
}

/// The committed map, asked of the scheduler (with retries) when a server starts.
pub async fn current_map(settings: &JobSettings, env: &RoleEnv) -> Result<PartitionMap, PsError> {
    let client =
        crate::net::scheduler_client(&env.scheduler_addr, settings.retry.timeout, &env.secret)?;
    let peer = format!("the scheduler at {}", env.scheduler_addr);
    let server_id = env.server_id as u32;
    let reply = settings
        .retry
        .run("PartitionMap", &peer, |_| {
            let mut c = client.clone();
            async move {
                c.partition_map(PartitionMapRequest {
                    server_id,
                    ready_epoch: 0,
                })
                .await
            }
        })
        .await?
        .into_inner();
    Ok(PartitionMap {
        epoch: reply.epoch,
        servers: reply.servers as usize,
    })
}

impl ServerService {
    /// Lets this server take part in migrations: `all` are the job's parameters, `epoch` the
    /// map it serves (`None`: it is being added and holds nothing yet).
    pub fn enable_migration(&self, all: Vec<ParamInfo>, epoch: Option<u64>) {
        let mut s = self.lock();
        s.migration.all = all;
        s.epoch = epoch;
    }

    /// The map epoch this server serves (`None` while it is being added).
    pub fn map_epoch(&self) -> Option<u64> {
        self.lock().epoch
    }

    /// Takes in a handover: checks every parameter belongs to this server under the new map
    /// and has the expected shape and optimizer state, and keeps it until the switch.
    pub(super) fn receive(&self, r: HandoverRequest) -> Result<Response<HandoverReply>, Status> {
        let mut s = self.lock();
        let me = s.server_id;
        if s.migration.all.is_empty() {
            return Err(Status::failed_precondition(format!(
                "Handover: server {me} takes no part in migrations"
            )));
        }
        if s.epoch.is_some_and(|e| e >= r.epoch) {
            // Already switched: a retried handover changes nothing.
            return Ok(Response::new(HandoverReply {}));
        }
        // The map's server count sizes the partition's tables: bounded before anything is
        // allocated from it; a map a handover moves to has at least 2 servers, this one among them.
        let servers = r.servers as usize;
        if servers < 2 || servers <= me || servers > runtime::MAX_PS_PROCESSES {
            return Err(Status::invalid_argument(format!(
                "Handover of epoch {}: a map of {servers} servers, expected 2 to {} (and more than server {me}'s id)",
                r.epoch,
                runtime::MAX_PS_PROCESSES
            )));
        }
        let owner = owners(&s.migration.all, servers);
        let state_names = s.optimizer.config().kind.state_names();
        let mut taken = Vec::with_capacity(r.weights.len());
        for msg in &r.weights {
            let Some(i) = s.migration.all.iter().position(|p| p.name == msg.name) else {
                return Err(Status::invalid_argument(format!(
                    "Handover of epoch {}: no parameter {}",
                    r.epoch, msg.name
                )));
            };
            if owner[i] != me {
                return Err(Status::invalid_argument(format!(
                    "Handover of epoch {}: parameter {} belongs to server {} under the map of {} servers, not to server {me}",
                    r.epoch, msg.name, owner[i], r.servers
                )));
            }
            let p = &s.migration.all[i];
            let weight = from_msg(msg, &p.name, &p.shape).map_err(super::status)?;
            let mut states = Vec::with_capacity(state_names.len());
            for &st in state_names {
                let name = state_checkpoint_name(st, &p.name);
                let m = r.states.iter().find(|m| m.name == name).ok_or_else(|| {
                    Status::invalid_argument(format!(
                        "Handover of epoch {}: parameter {} comes without its optimizer state {name}",
                        r.epoch, p.name
                    ))
                })?;
                states.push((st, from_msg(m, &name, &p.shape).map_err(super::status)?));
            }
            taken.push((p.name.clone(), Received { weight, states }));
        }
        let m = &mut s.migration;
        if m.inbox_epoch != r.epoch {
            m.inbox.clear();
            m.counters.clear();
            m.inbox_epoch = r.epoch;
        }
        m.inbox.extend(taken);
        m.counters.insert(
            r.from_server,
            Counters {
                version: r.version,
                optimizer_steps: r.optimizer_steps,
                last_loss: r.last_loss,
            },
        );
        Ok(Response::new(HandoverReply {}))
    }

    /// Hands every parameter this server holds and another owns under `reply`'s new map over
    /// to its owner (retried with backoff).
    async fn hand_over(
        &self,
        reply: &PartitionMapReply,
        policy: &RetryPolicy,
        secret: &JobSecret,
    ) -> Result<(), PsError> {
        let (me, requests, limit) = {
            let s = self.lock();
            let owner = owners(&s.migration.all, reply.next_servers as usize);
            let states = s.optimizer.config().kind.state_names().len();
            let mut by_target: BTreeMap<usize, HandoverRequest> = BTreeMap::new();
            for (k, name) in s.names.iter().enumerate() {
                let i = s
                    .migration
                    .all
                    .iter()
                    .position(|p| &p.name == name)
                    .ok_or_else(|| PsError::missing_parameter(name, "the job's parameters"))?;
                if owner[i] == s.server_id {
                    continue;
                }
                let request = by_target
                    .entry(owner[i])
                    .or_insert_with(|| HandoverRequest {
                        from_server: s.server_id as u32,
                        epoch: reply.next_epoch,
                        servers: reply.next_servers,
                        version: s.version,
                        optimizer_steps: s.optimizer.step_count(),
                        last_loss: s.last_loss,
                        weights: Vec::new(),
                        states: Vec::new(),
                    });
                request.weights.push(to_msg(name, &s.weights[k]));
                for (st, t) in s.optimizer.state(k)? {
                    request
                        .states
                        .push(to_msg(&state_checkpoint_name(st, name), t));
                }
            }
            (
                s.server_id,
                by_target,
                handover_limit(&s.migration.all, states),
            )
        };
        for (to, request) in requests {
            let addr = reply
                .servers_addrs
                .iter()
                .find(|a| a.server_id as usize == to)
                .map(|a| a.addr.clone())
                .ok_or_else(|| {
                    PsError::message(
                        format!("PartitionMap reply of epoch {}", reply.next_epoch),
                        format!("it gives parameters to server {to}, which has no address"),
                    )
                })?;
            let client = server_client(&addr, policy.timeout, limit, secret)?;
            let client = client
                .max_encoding_message_size(limit)
                .max_decoding_message_size(limit);
            policy
                .run("Handover", &format!("server {to} at {addr}"), |_| {
                    let mut c = client.clone();
                    let r = request.clone();
                    async move { c.handover(r).await }
                })
                .await?;
            let names: Vec<&str> = request.weights.iter().map(|w| w.name.as_str()).collect();
            eprintln!(
                "[ps server {me}] handed {} over to server {to} with their optimizer state (partition map of epoch {})",
                names.join(", "),
                reply.next_epoch
            );
        }
        Ok(())
    }

    /// Switches to `reply`'s new map once every parameter it gives this server is here;
    /// snapshots the new partition. Whether it switched.
    fn try_switch(&self, reply: &PartitionMapReply) -> Result<bool, PsError> {
        let mut s = self.lock();
        let me = s.server_id;
        let owner = owners(&s.migration.all, reply.next_servers as usize);
        let held: Vec<ParamInfo> = s
            .migration
            .all
            .iter()
            .zip(&owner)
            .filter(|&(_, &o)| o == me)
            .map(|(p, _)| p.clone())
            .collect();
        let here = |s: &State, name: &str| {
            s.names.iter().any(|n| n == name)
                || (s.migration.inbox_epoch == reply.next_epoch
                    && s.migration.inbox.contains_key(name))
        };
        if !held.iter().all(|p| here(&s, &p.name)) {
            return Ok(false);
        }
        let specs: Vec<ParamSpec> = held
            .iter()
            .map(|p| ParamSpec {
                name: p.name.clone(),
                shape: p.shape.clone(),
                dtype: DType::F32,
            })
            .collect();
        let mut optimizer = Optimizer::new(*s.optimizer.config(), &specs)?;
        let mut weights = Vec::with_capacity(held.len());
        let mut received = Vec::new();
        for (k, p) in held.iter().enumerate() {
            if let Some(old) = s.names.iter().position(|n| n == &p.name) {
                weights.push(s.weights[old].clone());
                for (st, t) in s.optimizer.state(old)? {
                    optimizer.load_state(k, st, t)?;
                }
            } else {
                let r = s.migration.inbox.remove(&p.name).ok_or_else(|| {
                    PsError::missing_parameter(
                        &p.name,
                        format!("the parameters handed over to server {me}"),
                    )
                })?;
                weights.push(r.weight);
                for (st, t) in &r.states {
                    optimizer.load_state(k, st, t)?;
                }
                received.push(p.name.clone());
            }
        }
        if s.epoch.is_some() {
            optimizer.set_step_count(s.optimizer.step_count());
        } else {
            // An added server takes the counters of the servers that handed over.
            let c: Vec<Counters> = s.migration.counters.values().copied().collect();
            let version = c.iter().map(|c| c.version).max();
            s.version = match (s.sync, version) {
                (true, Some(v)) if v != reply.switch_step => {
                    return Err(PsError::message(
                        format!("handover of epoch {}", reply.next_epoch),
                        format!(
                            "the old owners applied {v} steps, the switch step is {}",
                            reply.switch_step
                        ),
                    ))
                }
                (_, Some(v)) => v,
                (_, None) => reply.switch_step,
            };
            optimizer.set_step_count(
                c.iter()
                    .map(|c| c.optimizer_steps)
                    .max()
                    .unwrap_or(s.version),
            );
            s.last_loss = c.first().map_or(f32::NAN, |c| c.last_loss);
        }
        s.names = held.iter().map(|p| p.name.clone()).collect();
        s.shapes = held.iter().map(|p| p.shape.clone()).collect();
        s.weights = weights;
        s.optimizer = optimizer;
        s.epoch = Some(reply.next_epoch);
        s.migration.inbox.clear();
        s.migration.counters.clear();
        s.snapshot()?;
        let names: Vec<&str> = s.names.iter().map(String::as_str).collect();
        eprintln!(
            "[ps server {me}] switched to the partition map of epoch {} ({} servers) at version {}: holds {}; received {}",
            reply.next_epoch,
            reply.next_servers,
            s.version,
            if names.is_empty() { "nothing".to_string() } else { names.join(", ") },
            if received.is_empty() { "nothing".to_string() } else { received.join(", ") }
        );
        Ok(true)
    }
}

/// One round of the migration protocol, run on every tick of the server's loop: reports the
/// map this server switched to, and when the scheduler says every worker waits at the switch
/// step (and, in sync mode, this server has applied every step before it), hands over what
/// moves and switches once what comes is here.
pub(super) async fn tick(
    service: &ServerService,
    client: &SchedulerClient<Channel>,
    policy: &RetryPolicy,
    secret: &JobSecret,
) -> Result<(), PsError> {
    let (me, ready_epoch) = {
        let s = service.lock();
        if s.migration.all.is_empty() {
            return Ok(());
        }
        (s.server_id as u32, s.epoch.unwrap_or(0))
    };
    let mut c = client.clone();
    let request = PartitionMapRequest {
        server_id: me,
        ready_epoch,
    };
    // One attempt per tick: the heartbeat is what fails the server when the scheduler is gone.
    let Attempt::Done(reply) = policy.attempt(c.partition_map(request)).await else {
        return Ok(());
    };
    let reply = reply.into_inner();
    if reply.next_epoch == 0 || !reply.go {
        return Ok(());
    }
    {
        let s = service.lock();
        if s.epoch == Some(reply.next_epoch) {
            return Ok(());
        }
        if s.sync && s.epoch.is_some() {
            if s.version > reply.switch_step {
                return Err(PsError::message(
                    format!("PartitionMap reply of epoch {}", reply.next_epoch),
                    format!(
                        "switch step {} is behind server {me}, which applied step {}",
                        reply.switch_step, s.version
                    ),
                ));
            }
            if s.version < reply.switch_step || !s.pending.is_empty() || s.awaiting.is_some() {
                return Ok(());
            }
        }
    }
    let sent = service.lock().migration.sent == Some(reply.next_epoch);
    if !sent {
        service.hand_over(&reply, policy, secret).await?;
        service.lock().migration.sent = Some(reply.next_epoch);
    }
    service.try_switch(&reply)?;
    Ok(())
}

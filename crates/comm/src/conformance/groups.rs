//! Sub-communicators: `split`, `group`, groups of groups, and groups used at the same time.

use tensor::Tensor;

use super::reference::{expect, wrong};
use super::CaseResult;
use crate::{Communicator, CommunicatorExt, ReduceOp};

/// `split` by parity, `group` with a custom order, and a group of a group.
pub fn split_and_groups(comm: &dyn Communicator) -> CaseResult {
    let (n, me) = (comm.size(), comm.rank());
    let half = comm.split(Some((me % 2) as u32))?.ok_or_else(|| {
        wrong(
            comm,
            "split gave no group to a rank with a color".to_string(),
        )
    })?;
    let members: Vec<usize> = (0..n).filter(|r| r % 2 == me % 2).collect();
    expect(
        comm,
        half.size() == members.len() && half.rank() == me / 2,
        || {
            format!(
                "split: rank {} of {} in the parity group",
                half.rank(),
                half.size()
            )
        },
    )?;
    let mut x = vec![me as i64; 3];
    half.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
    let want = members.iter().sum::<usize>() as i64;
    expect(comm, x == vec![want; 3], || {
        format!("sum over the parity group: {x:?}")
    })?;

    // Only rank 0 opts out.
    let rest = comm.split(if me == 0 { None } else { Some(1) })?;
    expect(comm, rest.is_none() == (me == 0), || {
        "split(None) gave a group".to_string()
    })?;
    if let Some(rest) = rest {
        let mut y = [1u32];
        rest.all_reduce_in_place(&mut y, ReduceOp::Sum)?;
        expect(comm, y[0] as usize == n - 1, || {
            format!("{} ranks counted themselves", y[0])
        })?;
    }

    // Reversed order: world rank n-1 becomes group rank 0.
    let reversed: Vec<usize> = (0..n).rev().collect();
    let rev = comm.group(&reversed)?;
    expect(comm, rev.rank() == n - 1 - me, || {
        format!("reversed group rank {}", rev.rank())
    })?;
    let got = rev.all_gather(&Tensor::from_vec(&[1], vec![me as i32]).expect("one"))?;
    let want: Vec<i32> = reversed.iter().map(|&r| r as i32).collect();
    expect(comm, got.as_slice::<i32>().ok() == Some(&want[..]), || {
        format!("gather in reversed group order: {got:?}")
    })?;
    // A group of the reversed group: its first two ranks (world ranks n-1, n-2).
    if n >= 2 && rev.rank() < 2 {
        let pair = rev.group(&[0, 1])?;
        let got = pair.all_gather(&Tensor::from_vec(&[1], vec![me as i32]).expect("one"))?;
        let want = [(n - 1) as i32, (n - 2) as i32];
        expect(comm, got.as_slice::<i32>().ok() == Some(&want[..]), || {
            format!("nested group gather: {got:?}")
        })?;
    }
    comm.barrier()?;
    Ok(())
}

/// Groups used at the same time: parity groups interleave different collectives and
/// point-to-point messages with the same tags as the world; overlapping pair groups exchange
/// on the same tag and are received in the opposite order.
pub fn concurrent_groups(comm: &dyn Communicator) -> CaseResult {
    let (n, me) = (comm.size(), comm.rank());
    let parity: Vec<usize> = (0..n).filter(|r| r % 2 == me % 2).collect();
    let group = comm.group(&parity)?;
    for round in 0..20 {
        let mut x = vec![(me + round) as f32; 257];
        if me % 2 == 0 {
            group.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
            let want: usize = parity.iter().map(|r| r + round).sum();
            expect(comm, x.iter().all(|&v| v == want as f32), || {
                format!("round {round}: even group sum {}", x[0])
            })?;
        } else {
            let got = group.all_gather(&Tensor::from_vec(&[257], x).expect("len"))?;
            expect(comm, got.shape() == [257 * parity.len()], || {
                format!("round {round}: odd group gather shape {:?}", got.shape())
            })?;
        }
        // The same tag on the group and on the world, received in the opposite order.
        let gn = group.size();
        let (gnext, gprev) = ((group.rank() + 1) % gn, (group.rank() + gn - 1) % gn);
        group.send_bytes(gnext, 5, &[round as u8, 1])?;
        comm.send_bytes((me + 1) % n, 5, &[round as u8, 2])?;
        let from_world = comm.recv_bytes((me + n - 1) % n, 5)?;
        let from_group = group.recv_bytes(gprev, 5)?;
        expect(
            comm,
            from_world == [round as u8, 2] && from_group == [round as u8, 1],
            || format!("round {round}: world got {from_world:?}, group got {from_group:?}"),
        )?;
    }
    // Overlapping pairs: {2k, 2k+1} and {2k+1, 2k+2 mod n}, same tag on both.
    if n >= 4 && n % 2 == 0 {
        let a = comm.group(&[me & !1, me | 1])?;
        let b_members = if me % 2 == 1 {
            [me, (me + 1) % n]
        } else {
            [(me + n - 1) % n, me]
        };
        let b = comm.group(&b_members)?;
        a.send_bytes(1 - a.rank(), 9, b"via a")?;
        b.send_bytes(1 - b.rank(), 9, b"via b")?;
        let from_b = b.recv_bytes(1 - b.rank(), 9)?;
        let from_a = a.recv_bytes(1 - a.rank(), 9)?;
        expect(comm, from_a == b"via a" && from_b == b"via b", || {
            "messages crossed between overlapping groups".to_string()
        })?;
    }
    comm.barrier()?;
    Ok(())
}

//! Conversion plans ([`ckpt::conversion_plan`]): per destination rank and parameter, the
//! pieces of its box and the source ranks holding each, from the strategies alone or with the
//! source checkpoint's shapes.

use std::collections::BTreeSet;

use ckpt::{CkptError, PlanShapes, RankConversionPlan, Strategy};
use layout::SliceBox;

use crate::util::case;

const CASES: [&str; 2] = ["case1_dp2mp4_to_2x2", "case3_opt_shard_to_4"];

/// Every source rank's first-slot box of `name` met with `region`, the distinct intersections
/// each with its holders, in the order ranks first hold them: the plan a per-rank search finds
/// (one slot per rank, which is every slot on these non-interleaved meshes).
fn per_rank_pieces(
    src: &ckpt::ResolvedStrategy,
    name: &str,
    region: &SliceBox,
) -> Vec<(Vec<usize>, Vec<usize>, Vec<usize>)> {
    let p = src.param(name).unwrap();
    let mut pieces: Vec<(SliceBox, Vec<usize>)> = Vec::new();
    for r in src.ranks() {
        let Some((pl, slot)) = p.placement_of_rank(r) else {
            continue;
        };
        let Some(piece) = pl.held.slot_box(slot).intersect(region) else {
            continue;
        };
        match pieces.iter_mut().find(|(b, _)| *b == piece) {
            Some((_, holders)) => holders.push(r),
            None => pieces.push((piece, vec![r])),
        }
    }
    pieces
        .into_iter()
        .map(|(b, h)| (b.offset.into_vec(), b.shape.into_vec(), h))
        .collect()
}

fn check_plan(c: &std::path::Path, plan: &[RankConversionPlan], src: &ckpt::ResolvedStrategy) {
    let a = Strategy::load(&c.join("strategy/A.ckpt")).unwrap();
    let b = Strategy::load(&c.join("strategy/B.ckpt")).unwrap();
    for rp in plan {
        let cover = ckpt::minimal_rank_list(&a, Some(&b), rp.rank).unwrap();
        assert_eq!(rp.cover, cover, "rank {}", rp.rank);
        assert!(!rp.params.is_empty());
        for p in &rp.params {
            // The pieces tile the box: inside it, pairwise disjoint, volumes summing to it.
            let total: usize = p.pieces.iter().map(|x| x.region.n_elements()).sum();
            assert_eq!(total, p.region.n_elements(), "{}", p.name);
            for (i, x) in p.pieces.iter().enumerate() {
                assert!(p.region.contains(&x.region), "{}", p.name);
                for y in &p.pieces[i + 1..] {
                    assert!(x.region.intersect(&y.region).is_none(), "{}", p.name);
                }
                // Held by a rank of the cover, and every holder's slice contains it.
                assert!(
                    x.holders.iter().any(|h| cover.ranks.contains(h)),
                    "{}",
                    p.name
                );
                let sp = src.param(&p.name).unwrap();
                for &h in &x.holders {
                    let (pl, slot) = sp.placement_of_rank(h).unwrap();
                    assert!(pl.held.slot_box(slot).contains(&x.region), "{}", p.name);
                }
            }
            // Ordered by their lowest holder.
            let firsts: Vec<usize> = p.pieces.iter().map(|x| x.holders[0]).collect();
            assert!(firsts.windows(2).all(|w| w[0] <= w[1]), "{}", p.name);
            // The same pieces, holders and order as a search over every source rank's slice.
            let got: Vec<_> = p
                .pieces
                .iter()
                .map(|x| {
                    (
                        x.region.offset.to_vec(),
                        x.region.shape.to_vec(),
                        x.holders.clone(),
                    )
                })
                .collect();
            assert_eq!(got, per_rank_pieces(src, &p.name, &p.region), "{}", p.name);
        }
    }
}

#[test]
fn plan_with_checkpoint_shapes_tiles_every_box_from_the_minimal_ranks() {
    for name in CASES {
        let Some(c) = case(name) else { return };
        let a = Strategy::load(&c.join("strategy/A.ckpt")).unwrap();
        let b = Strategy::load(&c.join("strategy/B.ckpt")).unwrap();
        let dir = c.join("src_ckpt");
        let plan = ckpt::conversion_plan(&a, Some(&b), PlanShapes::Checkpoint(&dir), None).unwrap();
        assert_eq!(
            plan.iter().map(|p| p.rank).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        let src = ckpt::SourceSet::rank_dirs(&dir)
            .unwrap()
            .resolve_source(&a)
            .unwrap()
            .0;
        check_plan(&c, &plan, &src);
        if name == "case1_dp2mp4_to_2x2" {
            let w1 = plan[0].params.iter().find(|p| p.name == "net.w1").unwrap();
            assert_eq!(w1.global_shape, [64, 32]);
        }
    }
}

#[test]
fn plan_from_the_strategies_alone_has_the_same_holders() {
    for name in CASES {
        let Some(c) = case(name) else { return };
        let a = Strategy::load(&c.join("strategy/A.ckpt")).unwrap();
        let b = Strategy::load(&c.join("strategy/B.ckpt")).unwrap();
        let dir = c.join("src_ckpt");
        let real = ckpt::conversion_plan(&a, Some(&b), PlanShapes::Checkpoint(&dir), None).unwrap();
        let free = ckpt::conversion_plan(&a, Some(&b), PlanShapes::ScaleFree, Some(&[2])).unwrap();
        assert_eq!(free.len(), 1);
        assert_eq!(free[0].rank, 2);
        assert_eq!(free[0].cover, real[2].cover);
        let (src, _) = ckpt::resolve_scale_free_pair(&a, Some(&b)).unwrap();
        check_plan(&c, &free, &src);
        let holders = |p: &RankConversionPlan| -> Vec<(String, BTreeSet<Vec<usize>>)> {
            p.params
                .iter()
                .map(|x| {
                    let h = x.pieces.iter().map(|y| y.holders.clone()).collect();
                    (x.name.clone(), h)
                })
                .collect()
        };
        assert_eq!(holders(&free[0]), holders(&real[2]), "{name}");
    }
}

#[test]
fn plan_of_a_merge_and_of_a_rank_outside_the_destination() {
    let Some(c) = case("case1_dp2mp4_to_2x2") else {
        return;
    };
    let a = Strategy::load(&c.join("strategy/A.ckpt")).unwrap();
    let merged = ckpt::conversion_plan(&a, None, PlanShapes::ScaleFree, None).unwrap();
    assert_eq!(merged.len(), 1);
    assert_eq!(
        merged[0].cover,
        ckpt::minimal_rank_list(&a, None, 0).unwrap()
    );
    for p in &merged[0].params {
        assert_eq!(p.region, SliceBox::full(&p.global_shape), "{}", p.name);
    }
    let b = Strategy::load(&c.join("strategy/B.ckpt")).unwrap();
    let err = ckpt::conversion_plan(&a, Some(&b), PlanShapes::ScaleFree, Some(&[9])).unwrap_err();
    assert!(
        matches!(err, CkptError::NotADestinationRank { rank: 9, .. }),
        "{err}"
    );
}

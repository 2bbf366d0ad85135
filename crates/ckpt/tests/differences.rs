//! Where Tessera deliberately differs from MindSpore 2.10 (see docs/MINDSPORE_DIFFERENCES.md).

use ckpt::{MsLayout, MsLayoutItem, MsStrategyFile};

use crate::util::tmp;

/// MindSpore's `get_parameter_redundancy` reads only the first `tensor_map` entry, so a
/// multi-axis layout `[[1], [0]]` on dev [2, 4] gets `[[0,1,2,3],[4,5,6,7]]`. Every rank holds a
/// different block: eight singletons is right.
#[test]
fn multi_axis_redundancy_is_computed_from_the_whole_map() {
    let dir = tmp();
    let path = dir.path().join("multi.ckpt");
    let file = MsStrategyFile {
        current_stage: 1,
        strategy_items: Vec::new(),
        layout_items: vec![
            MsLayoutItem {
                param_name: "w_multi".into(),
                layout: MsLayout {
                    dev_matrix: vec![vec![2, 4]],
                    tensor_map: vec![vec![1], vec![0]],
                    param_split_shape: vec![vec![]],
                    indices_offset: vec![vec![]],
                    ..MsLayout::default()
                },
            },
            MsLayoutItem {
                // (dp, mp) both on dim 0: still eight distinct blocks.
                param_name: "b_multi".into(),
                layout: MsLayout {
                    dev_matrix: vec![vec![2, 4]],
                    tensor_map: vec![vec![1, 0], vec![]],
                    param_split_shape: vec![vec![]],
                    indices_offset: vec![vec![]],
                    ..MsLayout::default()
                },
            },
        ],
    };
    std::fs::write(&path, file.encode()).unwrap();
    let map = ckpt::redundancy_of_file(&path).unwrap();
    for (name, groups) in &map {
        assert_eq!(groups.len(), 8, "{name}: {groups:?}");
        assert!(groups.iter().all(|g| g.len() == 1), "{name}: {groups:?}");
    }
    // b_multi's block order is dp-major over its one dim: rank 1 holds block 1.
    let s = ckpt::Strategy::load(&path).unwrap();
    let resolved = s.resolve_scale_free().unwrap();
    let b = resolved.param("b_multi").unwrap();
    assert_eq!(b.shape[..], [8]);
    assert_eq!(b.placements[0].held.rank_box(1).unwrap().offset[..], [1]);
    assert_eq!(b.placements[0].held.rank_box(4).unwrap().offset[..], [4]);
}

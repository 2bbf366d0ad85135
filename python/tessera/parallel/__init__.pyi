"""Type stubs of tessera.parallel (MindSpore 2.10's signatures, Tessera's keyword-only additions)."""

from os import PathLike
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .._tessera import CheckpointError as CheckpointError, CheckpointIOError as CheckpointIOError
from ._layout import Layout as Layout
from ._network_functions import parameter_broadcast as parameter_broadcast
from ._network_functions import sync_pipeline_shared_parameters as sync_pipeline_shared_parameters
from ._shard import shard as shard

_Path = Union[str, PathLike]
_Progress = Union[None, bool, Callable[[str, str, int], None]]

def convert_checkpoints(src_checkpoints_dir: _Path, dst_checkpoints_dir: _Path, ckpt_prefix: str,
                        src_strategy_file: Optional[_Path] = None,
                        dst_strategy_file: Optional[_Path] = None, process_num: int = 1,
                        output_format: str = "ckpt", *, force: bool = False,
                        allow_missing: bool = False, progress: _Progress = None,
                        fsync: bool = True) -> None: ...
def convert_checkpoint_by_rank(rank_id: int, checkpoint_files_map: Dict[int, _Path],
                               save_checkpoint_file_name: _Path,
                               src_strategy_file: Optional[_Path] = None,
                               dst_strategy_file: Optional[_Path] = None, *, force: bool = False,
                               progress: _Progress = None, fsync: bool = True) -> None: ...
def rank_list_for_convert(rank_id: int, src_strategy_file: Optional[_Path] = None,
                          dst_strategy_file: Optional[_Path] = None) -> List[int]: ...
def unified_safetensors(src_dir: _Path, src_strategy_file: _Path, dst_dir: _Path,
                        merge_with_redundancy: bool = True, file_suffix: Optional[str] = None,
                        max_process_num: int = 64,
                        choice_func: Optional[Callable[[str], Union[bool, str]]] = None,
                        split_dst_file: Tuple[int, ...] = (), *, max_part_size: int = ...,
                        force: bool = False, progress: _Progress = None,
                        fsync: bool = True) -> None: ...
def load_distributed_checkpoint(network: Any, checkpoint_filenames: Optional[Sequence[_Path]] = None,
                                predict_strategy: Union[None, _Path, Dict[str, Sequence[Any]]] = None,
                                train_strategy_filename: Optional[_Path] = None,
                                strict_load: bool = False, dec_key: Optional[bytes] = None,
                                dec_mode: str = "AES-GCM", format: str = "ckpt",
                                unified_safetensors_dir: Optional[_Path] = None,
                                dst_safetensors_dir: Optional[_Path] = None,
                                rank_id: Optional[int] = None, output_format: str = "safetensors",
                                name_map: Optional[Dict[str, str]] = None,
                                max_process_num: int = 64, return_param_dict: bool = False, *,
                                force: bool = False, progress: _Progress = None,
                                fsync: bool = True,
                                allow_missing: bool = False) -> Optional[Dict[str, np.ndarray]]: ...
def load_segmented_checkpoints(ckpt_file_dir: _Path, net: Any = None, strict_load: bool = False,
                               filter_prefix: Union[None, str, Sequence[str]] = None,
                               dec_key: Optional[bytes] = None, dec_mode: str = "AES-GCM",
                               specify_prefix: Union[None, str, Sequence[str]] = None,
                               choice_func: Optional[Callable[[str], bool]] = None) -> Dict[str, np.ndarray]: ...
def build_searched_strategy(strategy_filename: _Path) -> Dict[str, Dict[str, Any]]: ...
def merge_sliced_parameter(sliced_parameters: List[Any],
                           strategy: Optional[Dict[str, Dict[str, Any]]] = None) -> Any: ...
def set_algo_parameters(**kwargs: Any) -> None: ...
def get_algo_parameters(attr_key: str) -> Any: ...
def reset_algo_parameters() -> None: ...
def set_op_strategy_config(mode: str = "SAVE", path: str = "") -> None: ...
transform_checkpoints = convert_checkpoints
transform_checkpoint_by_rank = convert_checkpoint_by_rank
rank_list_for_transform = rank_list_for_convert
def merge_pipeline_strategys(src_strategy_dirs: _Path, dst_strategy_file: _Path, *,
                             force: bool = False) -> None: ...
def restore_group_info_list(group_info_file_name: _Path) -> List[int]: ...
def reshard_plan(src_strategy_file: _Path, dst_strategy_file: Optional[_Path] = None,
                 src_checkpoints_dir: Optional[_Path] = None,
                 rank_id: Optional[int] = None) -> List[Dict[str, Any]]: ...
def layout_slices(layout: Layout, shape: Sequence[int]) -> Dict[str, Any]: ...
def verify_checkpoint(checkpoints_dir: _Path, strategy_file: _Path,
                      check_replicas: bool = False) -> Dict[str, Any]: ...

"""Type stubs of the native module ``tessera._tessera`` (Rust, PyO3). Use ``tessera.parallel``
and ``tessera.train`` / ``tessera.plan``; these are their building blocks."""

from os import PathLike
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

_Path = Union[str, PathLike]
_Progress = Optional[Callable[[str, str, int], None]]

class CheckpointError(ValueError):
    """Bad checkpoint, strategy or request."""
    file: Optional[str]
    tensor: Optional[str]
    rule: str

class CheckpointIOError(OSError):
    """An operating-system error on a checkpoint file."""
    file: Optional[str]
    tensor: Optional[str]
    rule: str

class ConfigError(ValueError):
    """A training configuration that breaks a rule (``tensor`` holds the key, if any)."""
    file: Optional[str]
    tensor: Optional[str]
    rule: str

def convert_checkpoints(src_dir: _Path, src_strategy: _Path, dst_dir: _Path,
                        dst_strategy: Optional[_Path] = None, prefix: str = "checkpoint_",
                        output_format: Optional[str] = None, ranks: Optional[Sequence[int]] = None,
                        force: bool = False, allow_missing: bool = False,
                        progress: _Progress = None, fsync: bool = True) -> Dict[str, Any]: ...
def convert_unsharded(src_dir: _Path, dst_dir: _Path, dst_strategy: _Path, prefix: str = "checkpoint_",
                      output_format: Optional[str] = None, force: bool = False,
                      progress: _Progress = None, fsync: bool = True) -> Dict[str, Any]: ...
def convert_checkpoint_files(rank: int, files: Dict[int, _Path], src_strategy: Optional[_Path], dst_file: _Path,
                             dst_strategy: Optional[_Path] = None, force: bool = False,
                             progress: _Progress = None, fsync: bool = True) -> Dict[str, Any]: ...
def rank_list(rank: int, src_strategy: _Path, dst_strategy: Optional[_Path] = None) -> Tuple[List[int], bool]: ...
_LayoutEntry = Tuple[str, List[int], List[int], List[int], int, int, int]

def unified_safetensors(src_dir: _Path, strategy: _Path, dst_dir: _Path, dedup: bool = False,
                        max_part_bytes: int = ..., force: bool = False,
                        progress: _Progress = None, file_suffix: Optional[str] = None,
                        choice: Optional[Callable[[str], Union[bool, str]]] = None,
                        split: Optional[Tuple[int, int]] = None,
                        fsync: bool = True) -> Dict[str, Any]: ...
def load_distributed_files(unified_dir: _Path, strategy: Optional[_Path], dst_dir: _Path,
                           ranks: Optional[Sequence[int]] = None, output_format: Optional[str] = None,
                           force: bool = False, progress: _Progress = None,
                           layouts: Optional[List[_LayoutEntry]] = None,
                           name_map: Optional[Dict[str, str]] = None,
                           fsync: bool = True) -> Dict[str, Any]: ...
def load_rank_from_files(files: Dict[int, _Path], src_strategy: Optional[_Path], dst_strategy: Optional[_Path],
                         rank: int, layouts: Optional[List[_LayoutEntry]] = None,
                         dec_key: Optional[bytes] = None,
                         dec_mode: str = "AES-GCM") -> Dict[str, np.ndarray]: ...
def load_rank_from_unified(unified_dir: _Path, strategy: Optional[_Path], rank: int,
                           layouts: Optional[List[_LayoutEntry]] = None) -> Dict[str, np.ndarray]: ...
def load_segmented_checkpoints(dir: _Path, dec_key: Optional[bytes] = None,
                               dec_mode: str = "AES-GCM") -> Dict[str, np.ndarray]: ...
def encrypt_checkpoint_file(src: _Path, dst: _Path, key: bytes, mode: str = "AES-GCM",
                            force: bool = False) -> str: ...
def build_searched_strategy(file: _Path) -> str: ...
def merge_pipeline_strategys(src_dir: _Path, dst_file: _Path, force: bool = False) -> Dict[str, Any]: ...
def restore_group_info_list(file: _Path) -> List[int]: ...
def verify_checkpoint(src_dir: _Path, strategy: _Path, replicas: bool = False) -> Dict[str, Any]: ...
def reshard_plan(src_strategy: _Path, dst_strategy: Optional[_Path] = None,
                 src_dir: Optional[_Path] = None,
                 ranks: Optional[Sequence[int]] = None) -> List[Dict[str, Any]]: ...
def layout_to_dict(device_matrix: Sequence[int], alias_name: Sequence[str],
                   rank_list: Optional[Sequence[int]] = None,
                   tensor_map: Optional[List[Union[str, List[str]]]] = None) -> Dict[str, Any]: ...
def layout_slices(device_matrix: Sequence[int], alias_name: Sequence[str],
                  rank_list: Optional[Sequence[int]], tensor_map: List[Union[str, List[str]]],
                  shape: Sequence[int]) -> Dict[str, Any]: ...
def train(path: Optional[_Path] = None, text: Optional[str] = None, devices: Optional[int] = None,
          overrides: List[str] = ..., log_json: Optional[_Path] = None, print_loss: bool = False,
          timeout: float = 300.0) -> Dict[str, Any]: ...
def plan(path: Optional[_Path] = None, text: Optional[str] = None, devices: Optional[int] = None,
         overrides: List[str] = ...) -> Dict[str, Any]: ...

class NetworkBuilder:
    """The graph a network's ``construct`` is traced into (``tessera.nn``); every method returns
    ``(value id, shape)``."""
    def __init__(self) -> None: ...
    def input(self, name: str, shape: List[int], dtype: str) -> Tuple[int, List[int]]: ...
    def parameter(self, name: str, shape: List[int], init: str,
                  scale: float = 0.01) -> Tuple[int, List[int]]: ...
    def op(self, kind: str, name: str, inputs: List[int],
           **attrs: Any) -> List[Tuple[int, List[int], str]]: ...
    def shape(self, id: int) -> List[int]: ...
    def node_names(self) -> List[str]: ...

def train_network(builder: NetworkBuilder, input: int, labels: int, logits: int, loss: int,
                  inputs: np.ndarray, label_data: np.ndarray, config: str, *,
                  batch_size: Optional[int] = None, shuffle: bool = True, backend: str = "local",
                  callback: Optional[Callable[[int, int, int, float, float], None]] = None,
                  ) -> Tuple[List[float], Optional[str]]: ...
def parameter_values(builder: NetworkBuilder, name: str, values: np.ndarray,
                     trainable: bool = True) -> Tuple[int, List[int]]: ...
def save_tensors(path: _Path, tensors: List[Tuple[str, np.ndarray]]) -> str: ...
def read_parameters(ckpt_dir: _Path, names: List[Tuple[str, List[int]]]) -> List[np.ndarray]: ...
def forward_network(builder: NetworkBuilder, input: int, output: int,
                    params: List[Tuple[int, np.ndarray]], inputs: np.ndarray) -> np.ndarray: ...

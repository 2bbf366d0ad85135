"""``tessera.mint.optim``: MindSpore's ``mindspore.mint.optim`` (PyTorch's optimizer API)."""

from ..nn.optim import _AdamFamily, _learning_rate, _number

__all__ = ["AdamW"]

_GROUP_KEYS = ("params", "lr", "betas", "eps", "weight_decay", "amsgrad", "maximize")


class AdamW(_AdamFamily):
    """MindSpore's ``mint.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
    weight_decay=1e-2, amsgrad=False, *, maximize=False)``: PyTorch's AdamW rule (bias-corrected
    moments, weight decay decoupled and scaled by the learning rate), the engine's
    ``mint_adamw``. Weight decay applies to every parameter, as in PyTorch; the engine never
    decays names containing ``beta`` or ``gamma``, so such a parameter with weight decay is a
    ``ValueError`` (give it a group with ``weight_decay`` 0.0). ``lr`` is a number.

    Parameter groups (``[{'params': [...], 'weight_decay': 0.0}, ...]``) may differ only in
    ``weight_decay`` being one value or 0.0; another per-group ``lr``, ``betas``, ``eps``, or
    ``amsgrad``/``maximize`` set, is a ``ValueError`` naming the group and the key.
    ``amsgrad=True`` and ``maximize=True`` are not supported (the engine has neither).

    ``max_grad_norm`` (keyword-only, a Tessera addition): as for ``tessera.nn`` optimizers."""

    _engine_name = "mint_adamw"
    _defaults_filter = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, maximize=False, max_grad_norm=None):
        if not isinstance(_learning_rate("AdamW", lr), float):
            raise TypeError("AdamW: lr must be a number")
        if amsgrad or maximize:
            raise ValueError("AdamW: amsgrad and maximize must be False (the engine's mint_adamw "
                             "has neither)")
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"AdamW: betas must be a pair (beta1, beta2), got {betas!r}")
        self._betas(*betas, eps)
        super().__init__(lr, params, weight_decay, max_grad_norm=max_grad_norm)

    @property
    def lr(self):
        """The learning rate (PyTorch's name)."""
        return self.learning_rate

    def _group_hyper(self, owner, index, group):
        for key in group:
            if key not in _GROUP_KEYS:
                raise ValueError(f"{owner}: parameter group {index} has key {key!r} (keys: "
                                 f"{list(_GROUP_KEYS)})")
        same = {"lr": self.learning_rate, "eps": self.eps, "amsgrad": False, "maximize": False}
        for key, want in same.items():
            if key in group and group[key] != want:
                raise ValueError(f"{owner}: parameter group {index} sets {key!r} = "
                                 f"{group[key]!r}, not the optimizer's {want!r}: the engine has "
                                 "one value for every parameter")
        if "betas" in group and tuple(_number(owner, "betas", b) for b in group["betas"]) != (
                self.beta1, self.beta2):
            raise ValueError(f"{owner}: parameter group {index} sets 'betas' = "
                             f"{group['betas']!r}, not the optimizer's: the engine has one value "
                             "for every parameter")

"""relaxcc's algorithm modules, for relaxcc.DistributedDataParallel.

Each class takes its module's options as keyword arguments, with the C++
defaults (``DiLoCo.defaults()`` lists them); nested options are dicts
(``deadline={"adaptive": True}``), optional ones None or a dict, enums their
names (``rounding="stochastic"``), durations datetime.timedelta or seconds.
An unknown option or a value out of range raises relaxcc.InvalidArgument (a
ValueError), a value of the wrong type relaxcc.InvalidType (also a
TypeError), both at construction::

    algorithm = relaxcc.algorithms.DiLoCo(inner_steps=500, codec={"bits": 4})
"""
import copy

from . import _C

__all__ = ["Algorithm", "GradientAllreduce", "ByteGrad", "QAdam", "CocktailSGD", "LocalSGD",
           "DecentralizedSGD", "LowPrecisionDecentralizedSGD", "AsyncModelAverage",
           "MoshpitSGD", "DiLoCo"]

_DEFAULTS = _C.algorithm_defaults()


class Algorithm:
    """An algorithm module's name and checked options (every default filled in)."""
    module = None

    def __init__(self, **options):
        self.options = _C.algorithm_options(self.module, options)

    @classmethod
    def defaults(cls):
        return copy.deepcopy(_DEFAULTS[cls.module])

    def __repr__(self):
        return f"{type(self).__name__}({self.options!r})"


def _module(class_name, module, doc):
    return type(class_name, (Algorithm,), {"module": module, "__doc__": doc})


GradientAllreduce = _module("GradientAllreduce", "gradient_allreduce",
                            "Gradient allreduce (averaging by default), as DDP's.")
ByteGrad = _module("ByteGrad", "bytegrad", "Gradients compressed to `bits` (min-max), allreduced.")
QAdam = _module("QAdam", "qadam",
                "1-bit Adam / Q-Adam: owns the step; the torch optimizer's lr is passed on.")
CocktailSGD = _module("CocktailSGD", "cocktail_sgd",
                      "CocktailSGD: random-k, top-k and quantization of the model delta.")
LocalSGD = _module("LocalSGD", "local_sgd", "Local SGD: models averaged every `period` steps.")
DecentralizedSGD = _module("DecentralizedSGD", "decentralized_sgd",
                           "Decentralized SGD: gossip of weights with peers.")
LowPrecisionDecentralizedSGD = _module("LowPrecisionDecentralizedSGD",
                                       "low_precision_decentralized_sgd",
                                       "Decentralized SGD with compressed weight differences (CHOCO).")
AsyncModelAverage = _module("AsyncModelAverage", "async_model_average",
                            "Asynchronous model averaging beside training.")
MoshpitSGD = _module("MoshpitSGD", "moshpit_sgd", "Moshpit SGD: averaging in groups of a grid.")


class DiLoCo(Algorithm):
    """DiLoCo: `inner_steps` local steps, then an outer step on the averaged
    pseudo-gradient. Streaming: fragments, overlap_steps; eager; a codec
    (codec={"kind": "minmax", "bits": 4}); SparseLoCo: DiLoCo.sparseloco(h)."""
    module = "diloco"

    @classmethod
    def paper(cls, inner_steps=500, **options):
        """DiLoCo's outer Nesterov SGD (lr 0.7, momentum 0.9), for an inner AdamW."""
        return cls(**{**_C.algorithm_preset("diloco_paper", inner_steps), **options})

    @classmethod
    def sparseloco(cls, inner_steps, **options):
        """SparseLoCo: chunk-wise top-k (2 of 64) with 2-bit values, decayed error feedback."""
        return cls(**{**_C.algorithm_preset("sparseloco", inner_steps), **options})


def _cocktail_sparse(**options):
    """CocktailSGD's sparsest setting that passes the convergence harness."""
    return CocktailSGD(**{**_C.algorithm_preset("cocktail_sparse"), **options})


CocktailSGD.sparse = staticmethod(_cocktail_sparse)

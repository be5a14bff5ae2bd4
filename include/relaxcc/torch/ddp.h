// Everything a libtorch training loop needs to go data parallel with one
// include: relaxcc::torch::DistributedDataParallel, create_mpi_communicator
// and every algorithm module (relaxcc::torch links relaxcc::algorithms), and
// build_description() (relaxcc/version.h).
#pragma once

#include "relaxcc/algorithms/async_model_average.h"
#include "relaxcc/algorithms/bytegrad.h"
#include "relaxcc/algorithms/cocktail_sgd.h"
#include "relaxcc/algorithms/decentralized_sgd.h"
#include "relaxcc/algorithms/diloco.h"
#include "relaxcc/algorithms/gradient_allreduce.h"
#include "relaxcc/algorithms/local_sgd.h"
#include "relaxcc/algorithms/low_precision_decentralized_sgd.h"
#include "relaxcc/algorithms/moshpit_sgd.h"
#include "relaxcc/algorithms/qadam.h"
#include "relaxcc/mpi_communicator.h"
#include "relaxcc/torch/distributed_data_parallel.h"
#include "relaxcc/version.h"

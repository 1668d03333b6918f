#include "kshard/optim/optim.hpp"

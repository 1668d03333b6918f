#pragma once
// kshard::optim umbrella header.

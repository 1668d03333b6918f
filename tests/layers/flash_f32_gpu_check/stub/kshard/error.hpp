#pragma once
#include <stdexcept>
#include <string>
namespace kshard { struct Error : std::runtime_error { Error(std::string a, std::string b) : std::runtime_error(a + "; expected " + b) {} }; }

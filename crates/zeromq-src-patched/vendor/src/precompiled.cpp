/* SPDX-License-Identifier: MPL-2.0 */

#include "precompiled.hpp"

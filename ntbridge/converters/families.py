"""torch's module types grouped by family, from their public classes (torch's common base classes,
such as ``_BatchNorm`` or ``_DropoutNd``, are private and may move)."""

from torch import nn

CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
         nn.ConvTranspose3d)
AVG_POOLS = (nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d,
             nn.AdaptiveAvgPool3d)
RESIZES = (nn.Upsample, nn.PixelShuffle, nn.PixelUnshuffle)
DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
            nn.FeatureAlphaDropout)
BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def examples_interact(model: nn.Module) -> bool:
    """Whether an example's output depends on the others in the batch (BatchNorm using batch
    statistics)."""
    return any(isinstance(m, BATCH_NORMS) and (m.training or m.running_mean is None)
               for m in model.modules())
